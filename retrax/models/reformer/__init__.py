"""Reformer models at Trax's module path `trax.models.reformer`."""

from retrax.models.reformer import reformer as reformer
from retrax.models.reformer.reformer import Reformer as Reformer
from retrax.models.reformer.reformer import ReformerLM as ReformerLM
from retrax.models.reformer.reformer import ReformerShortenLM as ReformerShortenLM
