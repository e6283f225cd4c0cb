"""Admission at the edge: what is refused before a request reaches a route.

guard.py        the outermost ASGI layer: API key, readiness / drain, the body up front, catch-all
body.py         reading the body bounded in size and time; its text checked for lone surrogates
connections.py  below the app, in uvicorn's protocol: head size and deadline, keep-alive, open
                connections
"""
