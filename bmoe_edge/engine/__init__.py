"""Run: the native engine and its Python face (settings, session, report, info, the headless runner).

The lowest stage: it imports nothing of the other stages (boards, fleet, proof, bench, cli).
"""

from bmoe_edge.engine.generation import Generation, Sampling, Token, TokenMetrics
from bmoe_edge.engine.session import Engine
from bmoe_edge.engine.settings import SETTINGS, Setting, StreamConfig

__all__ = ["SETTINGS", "Engine", "Generation", "Sampling", "Setting", "StreamConfig", "Token",
           "TokenMetrics"]
