"""Result rows: which run and which code made a row (``identity``), what a valid row is
(``schema``), the one reader (``results``) and a run's rows under its lock (``store``)."""
