"""The web page the daemon serves on its TCP listener (`prime-agent web`, docs/web.md): static files
under static/ (no build step; vendored libraries with their licences in static/vendor/), the login
(logins.py) and the routes (router.py)."""
