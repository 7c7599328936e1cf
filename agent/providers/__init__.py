"""The APIs a model is spoken to in (`model.provider`, docs/models.md#providers): chat completions
(agent/model.py's `OpenAIModel`, for OpenAI and every OpenAI-compatible server), Anthropic's Messages
(anthropic.py) and OpenAI's Responses (responses.py), each behind the one `Model` protocol."""

from __future__ import annotations

from agent.config_models import ModelConfig
from agent.model import OpenAIModel
from agent.providers.anthropic import AnthropicModel
from agent.providers.responses import ResponsesModel


def open_model(config: ModelConfig, key_hint: str = "", api_key: str | None = None) -> OpenAIModel:
    """The client of the provider in force (`config.api`: the one set, else the one the base URL names).
    `key_hint`: what to do when the server refuses the key; `api_key`: the key to send, if not the
    configuration's."""
    kind = {"anthropic": AnthropicModel, "openai-responses": ResponsesModel}.get(config.api, OpenAIModel)
    return kind(config, key_hint, api_key)
