"""The daemon API's routers, one module per area, each a thin face on `SessionManager` (reached
through `common.Manager`): status, sessions, events, goals, schedules, trajectory, refine, rewind,
approvals, harness. daemon/app.py puts them together."""
