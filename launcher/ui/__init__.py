"""``launcher ui``: every recorded run in a local web page, live, for the one user who started it.

:mod:`.server` starts it; :mod:`.access` decides who may ask; :mod:`.routes` answers (pages, and the JSON they read);
:mod:`.catalog` lists runs fast from their records; :mod:`.runpage` and :mod:`.logpage` describe one run and its log.
"""
