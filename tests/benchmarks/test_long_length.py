"""benchmarks/long_length.py: the memory-per-token table from worker results."""

from tests import benchmark_scripts

long_length = benchmark_scripts.load('long_length')


def _result(rss, wall, cpu):
  return dict(rss_bytes=rss, step_s=[wall], step_cpu_s=[cpu], first_s=2 * wall)


def test_rows_per_token_and_increment():
  results = {2048: _result(3_000_000, 2.0, 3.0),
             1024: _result(2_000_000, 1.0, 1.5),
             4096: {'error': 'timed out after 5 s'}}
  table = long_length.rows(results)
  assert table[0] == (1024, 0.002, 2_000_000 / 1024, None, 1.0, 1.5, 2.0)
  # The increment is the extra RSS over the previous length, per extra token.
  assert table[1] == (2048, 0.003, 3_000_000 / 2048, 1_000_000 / 1024, 2.0, 3.0,
                      4.0)
  assert table[2] == (4096, 'timed out after 5 s')
  text = long_length.format_table(table)
  assert '| 1,024 | 0.00 | 1,953 | — | 1.0 | 1.5 | 2.0 |' in text
  assert '| 2,048 | 0.00 | 1,465 | 977 | 2.0 | 3.0 | 4.0 |' in text
  assert '| 4096 | timed out after 5 s |' in text
