"""Part 1 of the Coursera "Putting the Re in Reformer" RevNet lab, run as `import retrax as trax`.

The printed text must equal what Trax prints: the lab's expected results
(`(array([3]), 'n', 'm')`, `(array([1089]), 'n', 'm')`) and Trax's layer reprs.
"""

import textwrap

LAB_PART_1 = textwrap.dedent('''
    import retrax as trax
    from retrax import layers as tl
    import numpy as np
    from retrax import fastmath
    from retrax import shapes
    from retrax.fastmath import numpy as jnp
    from retrax.shapes import ShapeDtype
    from retrax.shapes import signature

    # Part 1.1 Branch
    bl_add1 = tl.Fn("add1", lambda x0: (x0 + 1), n_out=1)
    bl_add2 = tl.Fn("add2", lambda x0: (x0 + 2), n_out=1)
    bl_add3 = tl.Fn("add3", lambda x0: (x0 + 3), n_out=1)
    x = np.array([1])
    print(bl_add1(x), bl_add2(x), bl_add3(x))
    print("name:", bl_add1.name, "number of inputs:", bl_add1.n_in,
          "number of outputs:", bl_add1.n_out)

    bl_3add1s = tl.Branch(bl_add1, bl_add2, bl_add3)
    print(repr(bl_3add1s))
    print(repr(bl_3add1s(x)))
    n = "n"
    m = "m"  # n, m will remain on the stack
    print(repr(bl_3add1s([x, n, m])))

    bl_addab = tl.Fn("addab", lambda x0, x1: (x0 + x1), n_out=1)
    bl_rep3x = tl.Fn("add2x", lambda x0: (x0, x0, x0), n_out=3)
    bl_3ops = tl.Branch(bl_add1, bl_addab, bl_rep3x)
    y = np.array([3])
    print(repr(bl_3ops([x, y, n, m])))

    bl_2ops = tl.Branch(bl_add1, None)
    print(repr(bl_2ops([x, n, m])))

    # Part 1.2 Residual Model
    def MyResidual(layer):
        return tl.Serial(
            tl.Branch(layer, None),
            tl.Add(),
        )

    mr = MyResidual(bl_add1)
    x = np.array([1])
    print(repr(mr([x, n, m])))

    Fl = tl.Fn("F", lambda x0: (2 * x0), n_out=1)
    Gl = tl.Fn("G", lambda x0: (10 * x0), n_out=1)
    x1 = np.array([1])
    resfg = tl.Serial(
        tl.Residual(Fl),  # x + F(x)
        tl.Residual(Gl),  # x + F(x) + G(x + F(x)) etc
        MyResidual(Fl),
        MyResidual(Gl),
    )
    print(repr(resfg([x1, n, m])))
    print(repr(tl.Residual(Fl)))
    print(repr(bl_3ops))
''')

EXPECTED = '''\
[2] [3] [4]
name: add1 number of inputs: 1 number of outputs: 1
Branch_out3[
  add1
  add2
  add3
]
(array([2]), array([3]), array([4]))
(array([2]), array([3]), array([4]), 'n', 'm')
(array([2]), array([4]), array([1]), array([1]), array([1]), 'n', 'm')
(array([2]), array([1]), 'n', 'm')
(array([3]), 'n', 'm')
(array([1089]), 'n', 'm')
Serial[
  Branch_out2[
    None
    F
  ]
  Add_in2
]
Branch_in2_out5[
  add1
  addab_in2
  add2x_out3
]
'''


def test_lab_part_1_prints_what_trax_prints(capsys):
  namespace = {}
  exec(compile(LAB_PART_1, 'revnet_lab_part1', 'exec'), namespace)
  assert capsys.readouterr().out == EXPECTED


def test_lab_networks_init_and_run_under_jit():
  import jax
  import numpy as np
  import retrax as trax
  tl = trax.layers
  f = tl.Fn('F', lambda x0: (2 * x0), n_out=1)
  g = tl.Fn('G', lambda x0: (10 * x0), n_out=1)
  resfg = tl.Serial(tl.Residual(f), tl.Residual(g), tl.Residual(f),
                    tl.Residual(g))
  x1 = np.array([1, 2], np.int32)
  weights, state = resfg.init(trax.shapes.signature(x1))
  assert trax.fastmath.tree_flatten(weights) == []
  y, _ = jax.jit(resfg.pure_fn)(x1, weights, state, jax.random.PRNGKey(0))
  assert y.tolist() == [1089, 2178]
  assert resfg.output_signature(trax.shapes.signature(x1)) == (
      trax.shapes.ShapeDtype((2,), np.int32))
