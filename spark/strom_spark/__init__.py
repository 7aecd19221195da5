"""The PySpark data source for strom (``spark.read.format("strom")``); built by its own issue."""
