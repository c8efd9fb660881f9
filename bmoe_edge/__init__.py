"""bmoe-edge: stream the experts of a Mixture-of-Experts model from flash, losslessly."""

__version__ = "0.1.0"
