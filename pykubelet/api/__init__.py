"""The Pod model and everything pure about it:
decoding, validation, quantities, QoS, static-pod defaults.
"""
