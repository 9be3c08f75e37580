"""lengthgen: does my attention variant still work at 1000x the training length?"""

__version__ = "0.1.0"
