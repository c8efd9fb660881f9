"""Benchmarks. Board side (standard library and the engine only, it runs on a board without numpy):
machine facts, the model's expert layout (layout), drive bandwidth and the engine's read pattern (io),
the RAM cap (ramcap), one measured cell (cells), routing traces (routing). Host side: the campaign
(campaign), its summary and targets (summary), plots (matplotlib), and the files written from them
(results). What `tune` measures is the tune stage's (it uses machine, layout and io).
"""
