"""The field's other length-generalizing attentions as lengthgen backends, on the public plugin API.

``fox``: Forgetting Attention (Lin et al., ICLR 2025). ``stickbreaking``: stick-breaking attention
(Tan et al., ICLR 2025). Both are registered as entry points (``pyproject.toml``) and import only
``lengthgen.api``; their definitions and choices are in ``baselines/README.md``.
"""

__version__ = "0.1.0"
