"""What is done with a run once it is recorded: evaluate its saved model again (``reevaluate``,
through the saved-run loader ``saved``), train it again from its rows (``restore``, ``verify``),
and probe its model at one length (``answers``: accuracy by answer position; ``heads``)."""
