"""Comparing strategies: the speedup table (``speedup_table``), turning runs into its rows
(``table_rows``), running a suite's rows (``bench_runner``) and the results history
(``result_history``). The top layer: it may use everything below.
"""
