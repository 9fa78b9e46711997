"""Configuration from .env: named backends, defaults, clear errors."""

import pytest

from backends.errors import ConfigurationError, UnknownBackend
from backends.registry import KINDS, backend_configs
from core.settings import SessionSettings, load_presets
from config import ChatDefaults, backend_names


def test_default_backends_are_the_three_stacks():
    configs = {c.name: c for c in backend_configs({})}
    assert list(configs) == ["llama_cpp", "vllm", "tgi"]
    assert configs["llama_cpp"].kind == "llamacpp" and configs["llama_cpp"].label == "llama.cpp (embedded)"
    assert configs["vllm"].base_url == "http://127.0.0.1:8001/v1"
    assert configs["tgi"].options == {"route": "messages", "adapter_id": "", "chat_template": ""}
    assert configs["llama_cpp"].options == {"model_path": "", "n_ctx": 2048, "threads": 0}


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
    assert configs["tgi-native"].options["route"] == "generate"
    assert configs["tgi-native"].options["adapter_id"] == "my-lora"
    assert configs["local-server"].options == {"model": ""} and configs["local-server"].base_url.endswith("/v1")


def test_every_backend_has_its_own_stream_limits_with_defaults():
    from backends.base import StreamLimits

    configs = {c.name: c for c in backend_configs({"LLAMA_CPP_FIRST_TOKEN_TIMEOUT_S": "90", "TGI_STALL_TIMEOUT_S": "5"})}
    assert StreamLimits.of(configs["llama_cpp"]) == StreamLimits(90.0, 30.0, "LLAMA_CPP_")
    assert StreamLimits.of(configs["vllm"]) == StreamLimits(60.0, 30.0, "VLLM_")
    assert StreamLimits.of(configs["tgi"]).stall_variable == "TGI_STALL_TIMEOUT_S"
    assert configs["tgi"].stall_timeout_s == 5.0
    assert (configs["vllm"].connect_timeout_s, configs["vllm"].timeout_s) == (3.0, 120.0)


def test_llama_cpp_model_path_variable():
    (config,) = backend_configs({"BACKENDS": "llama_cpp", "LLAMA_CPP_MODEL_PATH": "/models/ernie.gguf"})
    assert config.options["model_path"] == "/models/ernie.gguf"


def test_a_name_implies_its_kind_through_the_aliases_and_an_empty_value_takes_the_default():
    configs = {c.name: c for c in backend_configs({"BACKENDS": "llama.cpp,vllm,tgi", "TGI_ROUTE": " ",
                                                   "VLLM_TIMEOUT_S": ""})}
    assert configs["llama.cpp"].kind == "llamacpp" and configs["llama.cpp"].label == "llama.cpp (embedded)"
    assert configs["tgi"].options["route"] == "messages" and configs["vllm"].timeout_s == 120.0
    (aliased,) = backend_configs({"BACKENDS": "box", "BOX_KIND": "llama_cpp", "BOX_N_CTX": "4096"})
    assert aliased.kind == "llamacpp" and aliased.options["n_ctx"] == 4096 and aliased.label == "box"


def test_an_unknown_kind_lists_every_known_kind():
    with pytest.raises(ConfigurationError) as raised:
        backend_configs({"BACKENDS": "box", "BOX_KIND": "sglang"})
    message = str(raised.value)
    assert "'sglang'" in message and "BOX_KIND" in message
    assert all(kind.name in message for kind in KINDS)


def test_a_backend_built_in_code_gets_its_kinds_defaults_and_a_typo_is_refused():
    from backends.tgi import KIND as TGI
    from config import BackendConfig

    assert TGI.options_of(BackendConfig("t", "tgi", "T"))["route"] == "messages"
    with pytest.raises(ConfigurationError, match="has no option rout; its options: route, adapter_id"):
        TGI.options_of(BackendConfig("t", "tgi", "T", options={"rout": "generate"}))
    with pytest.raises(ConfigurationError, match="T_ROUTE='grpc'"):
        TGI.options_of(BackendConfig("t", "tgi", "T", options={"route": "grpc"}))


def test_every_kind_declares_a_label_help_and_parsable_defaults():
    from config import BackendConfig

    assert len({kind.name for kind in KINDS}) == len(KINDS)
    names = [name for kind in KINDS for name in kind.names()]
    assert len(set(names)) == len(names), "an alias may imply one kind only"
    for kind in KINDS:
        assert kind.label and all(variable.help for variable in kind.declared_variables)
        kind.options_of(BackendConfig("x", kind.name, kind.label))  # every default parses
        assert set(kind.sampling) <= {"top_k", "min_p", "repetition_penalty", "seed"}


@pytest.mark.parametrize("env, needle", [
    ({"BACKENDS": "mystery"}, "MYSTERY_KIND"),
    ({"BACKENDS": "llama_cpp", "LLAMA_CPP_N_CTX": "big"}, "LLAMA_CPP_N_CTX"),
    ({"BACKENDS": "llama_cpp", "LLAMA_CPP_THREADS": "1.5"}, "LLAMA_CPP_THREADS='1.5' must be a whole number"),
    ({"BACKENDS": "a,a", "A_KIND": "vllm"}, "twice"),
    ({"BACKENDS": "tgi", "TGI_ROUTE": "grpc"}, "TGI_ROUTE"),
    ({"BACKENDS": "vllm", "VLLM_TIMEOUT_S": "soon"}, "VLLM_TIMEOUT_S"),
    ({"BACKENDS": "vllm", "VLLM_STALL_TIMEOUT_S": "0"}, "VLLM_STALL_TIMEOUT_S=0 must be a positive number"),
    ({"BACKENDS": "tgi", "TGI_FIRST_TOKEN_TIMEOUT_S": "-5"}, "TGI_FIRST_TOKEN_TIMEOUT_S"),
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


def test_settings_form_is_validated():
    defaults = ChatDefaults(backend="llama_cpp")
    presets = load_presets()
    assert {"helpful", "teacher", "chinese", "none"} <= set(presets)
    settings = SessionSettings.from_form(
        {"backend": "vllm", "temperature": 1.5, "top_p": "0.5", "max_new_tokens": 64.0,
         "system_preset": "teacher", "system_custom": "", "top_k": "", "min_p": " ", "seed": None},
        defaults, ["llama_cpp", "vllm"], presets)
    assert settings.temperature == 1.5
    params = settings.params()
    assert params.max_new_tokens == 64 and params.top_p == 0.5
    # Empty optional settings are not sent: None, not a number.
    assert (params.top_k, params.min_p, params.repetition_penalty, params.seed) == (None, None, None, None)
    assert settings.system_prompt(presets) == presets["teacher"]
    custom = SessionSettings.from_form({"backend": "vllm", "system_custom": "Be a pirate."},
                                       defaults, ["llama_cpp", "vllm"], presets)
    assert custom.system_prompt(presets) == "Be a pirate."
    with pytest.raises(UnknownBackend, match="Configured backends: llama_cpp, vllm"):
        SessionSettings.from_form({"backend": "tgi"}, defaults, ["llama_cpp", "vllm"], presets)


def test_optional_sampling_settings_are_parsed_from_the_text_fields():
    defaults = ChatDefaults(backend="llama_cpp")
    settings = SessionSettings.from_form(
        {"backend": "llama_cpp", "top_k": "40", "min_p": "0.05", "repetition_penalty": "1.1", "seed": "7"},
        defaults, ["llama_cpp"], load_presets())
    params = settings.params()
    assert (params.top_k, params.min_p, params.repetition_penalty, params.seed) == (40, 0.05, 1.1, 7)
    assert params.chosen() == {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 256, "top_k": 40,
                               "min_p": 0.05, "repetition_penalty": 1.1, "seed": 7}


@pytest.mark.parametrize("form, needle", [
    ({"temperature": 9}, "temperature '9' must be a number in 0..2"),
    ({"top_p": "abc"}, "top-p 'abc' must be a number"),
    ({"max_new_tokens": float("nan")}, "max new tokens"),
    ({"top_k": "4.5"}, "top-k '4.5' must be a whole number in 1..1000, or empty"),
    ({"top_k": "0"}, "top-k '0'"),
    ({"min_p": "2"}, "min-p '2' must be a number in 0..1"),
    ({"repetition_penalty": "-1"}, "repetition penalty '-1'"),
    ({"seed": "1e12"}, "seed '1e12' must be a whole number"),
    ({"system_preset": "../etc/passwd"}, "preset '../etc/passwd' does not exist"),
    ({"system_custom": "x" * 20_001}, "20,001 characters; the limit is 20,000"),
    ({"system_custom": ["not", "text"]}, "must be text"),
])
def test_values_the_panel_cannot_send_are_refused_with_what_is_wrong(form, needle):
    from core.settings import SettingsRejected

    with pytest.raises(SettingsRejected) as raised:
        SessionSettings.from_form({"backend": "llama_cpp", **form}, ChatDefaults(backend="llama_cpp"),
                                  ["llama_cpp"], load_presets())
    assert needle in str(raised.value)


def test_optional_defaults_from_env_are_validated():
    defaults = ChatDefaults.from_env({"DEFAULT_TOP_K": "20", "DEFAULT_SEED": ""}, ["llama_cpp"])
    assert defaults.top_k.default == 20 and defaults.seed.default is None
    with pytest.raises(ConfigurationError, match="DEFAULT_MIN_P=3 must be a number in 0..1, or empty"):
        ChatDefaults.from_env({"DEFAULT_MIN_P": "3"}, ["llama_cpp"])


def test_every_variable_is_documented_in_env_example():
    """Every global variable, and for every kind every variable it declares, under one backend
    name of that kind (a name that implies it, or one given N_KIND=<kind>), with its default."""
    from pathlib import Path

    from backends.kinds import kinds_by_name
    from config import GLOBAL_VARIABLES, env_prefix

    example = (Path(__file__).resolve().parent.parent / ".env.example").read_text()
    documented = {}
    for line in example.splitlines():
        if "=" in line:
            variable, _, value = line.lstrip("# ").partition("=")
            documented[variable.strip()] = value.split("  #")[0].strip()
    assert set(GLOBAL_VARIABLES) - set(documented) == set()
    by_name = kinds_by_name(KINDS)
    for kind in KINDS:
        prefixes = {env_prefix(name) for name in kind.names()}
        prefixes |= {variable[: -len("KIND")] for variable, value in documented.items()
                     if variable.endswith("_KIND") and by_name.get(value.lower()) is kind}
        complete = [prefix for prefix in prefixes
                    if all(prefix + v.name in documented for v in kind.declared_variables)]
        assert complete, f"no backend of kind {kind.name} in .env.example documents all of " \
                         f"{', '.join(v.name for v in kind.declared_variables)}"
        prefix = complete[0]
        for variable in kind.declared_variables:
            if variable.field != "label":
                assert documented[prefix + variable.name] in ("", variable.default), prefix + variable.name
