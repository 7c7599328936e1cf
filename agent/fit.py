"""A session fitted to the model it is pointed at, where the user set nothing: what the model's
server says of it (agent.model.fitted: the context window, a completion cap fitted to it, text
mode, sampling defaults), and the short base prompt where the full one would take more than an
eighth of the context.

A server that cannot be asked when the session starts (not up yet) is asked again before each
model call until it answers; so is the server of a model the session switches to. Where the fit
changes the settings, the system prompt is built afresh for them, and the user is told.
"""

from __future__ import annotations

from collections.abc import Callable

from agent import events as ev
from agent.config_models import ModelConfig
from agent.context import Current, Sinks
from agent.model import Model, fitted


class ModelFit:
    def __init__(self, current: Current, prompt_text: Callable[[ModelConfig], str],
                 replace_prompt: Callable[[str | None], None], sinks: Sinks):
        """`current`: the session's model and settings in force, which the fit replaces;
        `prompt_text(settings)`: the system prompt these settings would give; `replace_prompt(turn_id)`:
        build the system prompt in force afresh."""
        self.current, self.prompt_text, self.replace_prompt, self.sinks = current, prompt_text, replace_prompt, sinks
        self.pending = True
        """Not fitted yet: the server has not been asked, or could not be (it is not up), or the model changed."""
        self.unreached = False
        """The server could not be asked when last tried."""

    def model(self) -> Model:
        return self.current.model

    def settings(self) -> ModelConfig:
        return self.current.config.model

    def use(self, settings: ModelConfig) -> None:
        """Go on with these model settings: the model and everything that reads `current`."""
        self.current.model.reconfigure(settings)
        self.current.config = self.current.config.model_copy(update={"model": settings})

    async def fit(self) -> list[str]:
        """Fit the settings to what the server says, if it can be asked: the notices to show."""
        model = self.model()
        server = await model.describe()
        user = self.settings()
        self.unreached = not server.reached
        if self.unreached:
            return [f"the server at {user.base_url} could not be asked about {model.name} (not up yet?): the "
                    f"session assumes a {user.context_window:,}-token context until it answers"]
        self.pending = False
        fit = fitted(user, server)
        notes = []
        if fit.action_format != user.action_format:
            notes.append(f"the server says {model.name} renders no tools: the session is in text mode "
                         "(```python cells; model.action_format pins either)")
        if not user.user_set("base_prompt") and fit.base_prompt == "full":
            tokens = len(self.prompt_text(fit)) // 4
            if tokens > fit.context_window // 8:
                fit = fit.with_defaults(base_prompt="short")
                notes.append(f"the system prompt with the full base prompt (~{tokens:,} tokens) would take more "
                             f"than an eighth of the model's {fit.context_window:,}-token context: the short base "
                             "prompt is used (model.base_prompt pins either)")
        if fit is not user:
            self.use(fit)
        return notes

    async def before_call(self, turn_id: str) -> None:
        """Before a model call: a fit still pending is tried again. Once the server answers, the
        system prompt is built for what it said, and the user is told."""
        if not self.pending:
            return
        before, unreached = self.settings(), self.unreached
        notes = await self.fit()
        if self.pending:
            return  # still not up: the call will say so
        after = self.settings()
        if after is not before:
            self.replace_prompt(turn_id)
        if unreached:
            limit = f", completions of up to {after.max_completion_tokens:,} tokens" if after.max_completion_tokens else ""
            notes.insert(0, f"the server at {after.base_url} answered: {self.model().name} has a context of "
                            f"{after.context_window:,} tokens{limit}")
        for text in notes:
            self.sinks.emit(ev.Note(turn_id=turn_id, text=text))

    def text_mode(self, reason: str) -> bool:
        """The server refused tools (`ToolsRefused`): go on in text mode, with a fresh system prompt and
        a notice, unless the user pinned `model.action_format` (or it is text already). Whether it switched."""
        settings = self.settings()
        if settings.user_set("action_format") or self.model().action_format == "text":
            return False
        turn_id = self.sinks.turn_id()
        self.use(settings.with_defaults(action_format="text"))
        self.replace_prompt(turn_id)
        self.sinks.emit(ev.Note(turn_id=turn_id, text=f"{reason}; the session goes on in text mode (```python cells; "
                                                "model.action_format pins either)"))
        return True
