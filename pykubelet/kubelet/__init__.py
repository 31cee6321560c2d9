"""The sync loop: the desired pods, admission, housekeeping and the PLEG; it hands each pod to
its worker.
"""
