"""``upstream/`` holds webdataset 1.0.2's own tests, vendored unchanged: they import
``webdataset``, so they run only in the subprocess of ``test_webdataset_suite.py``, never in
this process (where ``webdataset`` is the real library, for the comparisons of other tests)."""

collect_ignore = ["upstream"]
