"""A daemon session's model clients and the key they are sent: a client's, kept in this process's memory
only, else the one its configuration has (the daemon's own, where `own_key_only` lets it go)."""

from __future__ import annotations

from typing import Any

from agent.config_models import Config
from agent.model import OpenAIModel
from agent.providers import open_model
from daemon.schemas import ModelKey

NO_KEY = ("the daemon has no API key for this session: export OPENAI_API_KEY in your shell and send the prompt "
          "again (the daemon takes the key from the client that creates the session or sends it a prompt, and "
          "keeps it in memory only: after a daemon restart, a prompt from a shell that has the key brings it back)")


def model_in_force(config: Config | None, overrides: dict[str, Any]) -> tuple[str, str | None]:
    """The model and endpoint a session runs or wakes with: its configuration's (`config`); where that no longer
    loads (None), what its config `overrides` say of them (a session `run` hosts keeps both there: `kept`)."""
    if config is not None:
        return config.model.name or "", config.model.base_url
    model = overrides.get("model", {})
    return model.get("name", ""), model.get("base_url")


class SessionModels:
    def __init__(self) -> None:
        self.key: ModelKey | None = None
        """The model API key a client gave for this session."""
        self.stale = False
        """A client gave another key while a model was open: the next one is built with it."""
        self.current: OpenAIModel | None = None
        self._retired: list[OpenAIModel] = []
        """Models switched away from, closed with the rest (background work may still use them)."""

    def api_key(self, config: Config) -> str | None:
        """The key the session's model is sent: its client's (`use_key`), else its configuration's."""
        return self.key.api_key.get_secret_value() if self.key is not None else config.model.api_key

    def use_key(self, key: ModelKey | None, base_url: str | None) -> None:
        """Take a client's key if it is meant for the session's endpoint `base_url` (another's is ignored, so a
        key never goes where its owner did not send it); an open model is rebuilt with it (`stale`)."""
        if key is None or key == self.key or not key.fits(base_url):
            return
        self.key, self.stale = key, self.current is not None

    def open(self, config: Config) -> OpenAIModel:
        """A model client for `config`, the one in use from now on (the one before it is closed with the rest)."""
        if self.key is not None:
            hint = "the API key is the one the client that last sent a prompt gave (its OPENAI_API_KEY): check it"
        elif config.model.api_key:
            hint = ("the API key is the daemon's own (its environment when it started, or config.toml); "
                    "a key exported in your shell since reaches the session with the next prompt sent from there")
        else:
            hint = NO_KEY
        model = open_model(config.model, key_hint=hint, api_key=self.api_key(config))
        if self.current is not None:
            self._retired.append(self.current)
        self.current, self.stale = model, False
        return model

    def release(self) -> list[OpenAIModel]:
        """Every model client opened, for the caller to close (the key stays: the session may wake again)."""
        models = [m for m in (self.current, *self._retired) if m is not None]
        self.current, self._retired = None, []
        return models
