"""Plans: a leaderboard's recipe as a file, and doing the work it still misses.

``plan`` reads a plan file and reads from a results dataset where each of its blocks stands,
``execute`` does the missing work, ``estimate`` and ``listing`` say what is missing and what it
costs (``lengthgen sweep --plan FILE --dry-run``). The leaderboard never imports this package:
the command line hands it the plan's runs and commands.
"""
