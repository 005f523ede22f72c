"""Optional integrations with training frameworks; each imports its framework only when used.

* :mod:`shardstream.integrations.accelerate`: HF accelerate and the HF ``Trainer``.
* :mod:`shardstream.integrations.lightning`: Lightning's ``Trainer`` with several processes.
"""
