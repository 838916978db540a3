"""Learning-rate schedules (Trax's ``trax.lr``): functions ``step -> lr``.

They accept Python ints and JAX scalars, including values traced under
``jax.jit``. ``MultifactorSchedule`` and ``EvalAdjustingSchedule`` are Trax
1.2's history-based factories for the legacy trainer.
"""

from retrax.lr.legacy import EvalAdjustingSchedule as EvalAdjustingSchedule
from retrax.lr.legacy import MultifactorSchedule as MultifactorSchedule
from retrax.lr.schedules import FACTOR_NAMES as FACTOR_NAMES
from retrax.lr.schedules import constant as constant
from retrax.lr.schedules import multifactor as multifactor
from retrax.lr.schedules import warmup as warmup
from retrax.lr.schedules import warmup_and_rsqrt_decay as warmup_and_rsqrt_decay
