"""Comparing strategies: the speedup table's types and stored form (``speedup_table``), computed
(``table_compute``) with its footer (``table_notes``), shown (``table_render``) and two tables
side by side (``table_compare``); turning runs into its rows (``table_rows``), running a suite's
rows (``bench_runner``) and the results history (``result_history``). The top layer: it may use
everything below.
"""
