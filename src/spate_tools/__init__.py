"""spate's workshop: the ``spate`` command, benchmarks, the demo, the fuzz and driver-race campaigns, the model
job they check against and a Spark standalone test cluster.

It imports the library (:mod:`spate`) and is never imported by it: a query needs nothing from here.
"""
