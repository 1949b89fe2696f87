"""Files copied into the scratch folder: the alias installer, the test harness, the outcome recorder.

They run in the scratch environment (Lightning's test requirements, geartrain installed), not here.
"""
