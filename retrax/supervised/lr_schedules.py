"""Trax's module path ``trax.supervised.lr_schedules``: re-exports :mod:`retrax.lr`."""

from retrax.lr import EvalAdjustingSchedule as EvalAdjustingSchedule
from retrax.lr import FACTOR_NAMES as FACTOR_NAMES
from retrax.lr import MultifactorSchedule as MultifactorSchedule
from retrax.lr import constant as constant
from retrax.lr import multifactor as multifactor
from retrax.lr import warmup as warmup
from retrax.lr import warmup_and_rsqrt_decay as warmup_and_rsqrt_decay
