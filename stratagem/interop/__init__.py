"""Conversions between Stratagem's documents and other systems' formats (AutoDist's strategy protobuf)."""

from stratagem.interop.autodist import strategy_from_autodist, strategy_to_autodist, unsupported_reasons

__all__ = ["strategy_from_autodist", "strategy_to_autodist", "unsupported_reasons"]
