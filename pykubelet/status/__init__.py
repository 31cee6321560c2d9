"""Pod status: computed from the runtime (generate), kept per pod (manager), sent to the API
server (patcher).
"""
