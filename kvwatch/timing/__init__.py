"""How long a vLLM engine takes, pure: one step on a card (steptime), a load's throughput and
latency from its steps (loadmodel, measured), the constants fitted to measurements (fit), a
deployment's own calibration (calibration) and the slices of a live server it is fitted from
(server_slices), the prompt budget that ends prefill interference (prefill_levers). Stands on
kvwatch.sizing's KV arithmetic (the blocks a load holds); the what-if, the twin's clock and
`kvwatch calibrate` use it. No I/O beyond reading a calibration file (tests/test_house.py holds
it)."""

from __future__ import annotations

__all__: list[str] = []
