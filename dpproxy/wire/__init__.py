"""The PostgreSQL wire protocol (v3) in front of the engine.

codec (bytes ⇄ messages) · types (OIDs, text/binary encoders) · auth (SCRAM) · settings (every
session setting: name, default, checks) · session (the state machine of one connection, no
sockets) · router (what a statement is) · catalog (the shadow catalog: structure, never data) ·
server (asyncio accept loop, TLS, cancel). Nothing below engine imports this package.
"""
