"""Configuration from .env: named backends, defaults, clear errors."""

import pytest

from backends.errors import ConfigurationError, UnknownBackend
from chat.settings import SessionSettings, load_presets
from config import ChatDefaults, backend_configs, backend_names


def test_default_backends_are_the_three_stacks():
    configs = {c.name: c for c in backend_configs({})}
    assert list(configs) == ["llama_cpp", "vllm", "tgi"]
    assert configs["llama_cpp"].kind == "llamacpp" and configs["llama_cpp"].label == "llama.cpp (embedded)"
    assert configs["vllm"].base_url == "http://127.0.0.1:8001/v1"
    assert configs["tgi"].tgi_route == "messages"


def test_any_number_of_named_backends_with_their_own_variables():
    env = {
        "BACKENDS": "vllm,vllm-big,local-server,tgi-native",
        "VLLM_BIG_KIND": "vllm", "VLLM_BIG_BASE_URL": "http://127.0.0.1:9000/v1/", "VLLM_BIG_API_KEY": "k",
        "LOCAL_SERVER_KIND": "openai", "LOCAL_SERVER_LABEL": "llama.cpp server",
        "TGI_NATIVE_KIND": "tgi", "TGI_NATIVE_ROUTE": "generate", "TGI_NATIVE_ADAPTER_ID": "my-lora",
    }
    configs = {c.name: c for c in backend_configs(env)}
    assert configs["vllm-big"].base_url == "http://127.0.0.1:9000/v1" and configs["vllm-big"].api_key == "k"
    assert configs["vllm-big"].label == "vllm-big"
    assert configs["local-server"].kind == "openai" and configs["local-server"].label == "llama.cpp server"
    assert configs["tgi-native"].tgi_route == "generate" and configs["tgi-native"].tgi_adapter_id == "my-lora"


def test_llama_cpp_model_path_variable():
    (config,) = backend_configs({"BACKENDS": "llama_cpp", "LLAMA_CPP_MODEL_PATH": "/models/ernie.gguf"})
    assert config.model_path == "/models/ernie.gguf"


@pytest.mark.parametrize("env, needle", [
    ({"BACKENDS": "mystery"}, "MYSTERY_KIND"),
    ({"BACKENDS": "a,a", "A_KIND": "vllm"}, "twice"),
    ({"BACKENDS": "tgi", "TGI_ROUTE": "grpc"}, "TGI_ROUTE"),
    ({"BACKENDS": "vllm", "VLLM_TIMEOUT_S": "soon"}, "VLLM_TIMEOUT_S"),
])
def test_bad_configuration_names_the_variable_to_fix(env, needle):
    with pytest.raises(ConfigurationError, match=needle):
        backend_configs(env)


def test_chat_defaults_and_bounds():
    defaults = ChatDefaults.from_env({"DEFAULT_TEMPERATURE": "0.2", "DEFAULT_BACKEND": "vllm"},
                                     backend_names({}))
    assert defaults.backend == "vllm" and defaults.temperature.default == 0.2
    with pytest.raises(ConfigurationError, match="DEFAULT_BACKEND"):
        ChatDefaults.from_env({"DEFAULT_BACKEND": "nope"}, ["llama_cpp"])
    with pytest.raises(ConfigurationError, match="outside"):
        ChatDefaults.from_env({"DEFAULT_TOP_P": "7"}, ["llama_cpp"])


def test_settings_form_is_validated_and_clamped():
    defaults = ChatDefaults(backend="llama_cpp")
    presets = load_presets()
    assert {"helpful", "teacher", "chinese", "none"} <= set(presets)
    settings = SessionSettings.from_form(
        {"backend": "vllm", "temperature": 9, "top_p": "0.5", "max_new_tokens": 64.0,
         "system_preset": "teacher", "system_custom": ""},
        defaults, ["llama_cpp", "vllm"], presets)
    assert settings.temperature == defaults.temperature.maximum
    assert settings.params().max_new_tokens == 64 and settings.params().top_p == 0.5
    assert settings.system_prompt(presets) == presets["teacher"]
    custom = SessionSettings.from_form({"backend": "vllm", "system_custom": "Be a pirate."},
                                       defaults, ["llama_cpp", "vllm"], presets)
    assert custom.system_prompt(presets) == "Be a pirate."
    with pytest.raises(UnknownBackend, match="Configured backends: llama_cpp, vllm"):
        SessionSettings.from_form({"backend": "tgi"}, defaults, ["llama_cpp", "vllm"], presets)


def test_every_variable_is_documented_in_env_example():
    from pathlib import Path

    from config import GLOBAL_VARIABLES, KIND_VARIABLES, backend_configs, env_prefix

    example = (Path(__file__).resolve().parent.parent / ".env.example").read_text()
    documented = {line.split("=", 1)[0].lstrip("# ").strip() for line in example.splitlines() if "=" in line}
    expected = set(GLOBAL_VARIABLES)
    for config in backend_configs({}):
        expected |= {env_prefix(config.name) + key for key in KIND_VARIABLES[config.kind]}
    assert expected - documented == set()
