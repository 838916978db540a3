"""Legacy path of `Inputs`: ``trax.supervised.inputs.Inputs`` in Trax 1.2.x."""

from retrax.data.inputs import Inputs as Inputs
