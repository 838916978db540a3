"""Shared test settings: float32 on CPU, deterministic."""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=1')
