"""Any running OpenAI-compatible server as an engine: `--endpoint URL` (the server with speculation)
and `--baseline-endpoint URL` (the same model without it; alone, the baseline only), started and
configured by the user (vLLM, SGLang, TGI, llama.cpp: anything that streams /v1/completions).
Either may list several servers of one model (URL1,URL2): each load is spread over them by the
client's router (served/client.py), their counters summed: a small fleet measured.

The load, the requests table and the lossless checks are the served measurement's
(served/measurement.py), as for the vLLM engine, its sibling. What differs is what the server tells: acceptance comes from vLLM's spec-decode counters (deltas around each repeat),
else SGLang's `sglang:spec_accept_length` / `sglang:spec_accept_rate` gauges or its /server_info's
`avg_spec_accept_length`; a server that exposes none leaves α and τ unknown (NaN, and the cell
says so). Memory is not seen from outside. An API key is read from the environment variable
--api-key-env names, sent as a bearer token, and never written anywhere.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from specbench.engines import Stage
from specbench.grid import Cell, SweepConfig, smallest_known, split_schedule
from specbench.models import ModelNotAvailable, load_tokenizer
from specbench.schema import AR, SIDE_BY_SIDE
from specbench.served.measurement import COUNTERS, ServedCellRun, ServedEngine, kv_cache_labels
from specbench.served.prometheus import Snapshot
from specbench.served.vllm_engine import model_path
from specbench.traces import Replay

SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE = "sglang:spec_accept_rate"


def base_url(url: str) -> str:
    """`http://host:8000/v1/` -> `http://host:8000` (requests add /v1/completions, /metrics)."""
    url = url.strip().rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def endpoint_urls(text: str) -> list[str]:
    """--endpoint's servers: one URL, or several of one model (URL1,URL2) that a load is spread over."""
    return [url.strip() for url in text.split(",")] if text.strip() else []


def validate_endpoint(config: SweepConfig) -> None:
    endpoints = config.engine.endpoint
    if not endpoints.urls and not endpoints.baseline_urls:
        raise ValueError("the endpoint engine needs --endpoint URL (a running OpenAI-compatible server)")
    for name, text in (("--endpoint", endpoints.urls), ("--baseline-endpoint", endpoints.baseline_urls)):
        urls = endpoint_urls(text)
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} must be http(s) URLs, got {url!r}")
        if len({base_url(url) for url in urls}) != len(urls):
            raise ValueError(f"{name} names a server twice: {text}")
    if config.grid.synthetic:
        raise ValueError("--weights random starts its own servers: it needs --engine vllm, not --endpoint")
    if config.engine.baseline_only:
        if config.grid.drafts:
            raise ValueError("--drafts names what --endpoint runs: --baseline-endpoint alone measures the baseline")
        return
    if len(config.grid.drafts) != 1 or len(config.grid.ks) != 1:
        raise ValueError("--endpoint measures one server: --drafts and --k name what it runs (one label and "
                         "one K, 0 for unknown; default: endpoint, 0)")
    if split_schedule(config.grid.drafts[0])[1] is not None:
        raise ValueError(f"draft {config.grid.drafts[0]!r}: an endpoint runs the schedule its server was started with; "
                         f"name the draft without @schedule")


def api_headers(config: SweepConfig) -> dict | None:
    key = os.environ.get(config.engine.endpoint.api_key_env, "") if config.engine.endpoint.api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else None


def served_context_limit(config: SweepConfig) -> int:
    """The context every endpoint of the sweep serves (the smallest; 0 where none says): a trace's
    rows past it would be refused (HTTP 400), so the replay leaves them out, as it does past the
    target's context on servers specbench starts."""
    return smallest_known(RemoteFleet(endpoint_urls(text), api_headers(config)).context_limit()
                     for text in filter(None, (config.engine.endpoint.urls, config.engine.endpoint.baseline_urls)))


def check_reachable(config: SweepConfig) -> None:
    """A one-line error when an endpoint does not list a model (unreachable, refused, empty)."""
    for text in filter(None, (config.engine.endpoint.urls, config.engine.endpoint.baseline_urls)):
        RemoteFleet(endpoint_urls(text), api_headers(config)).model_id()


class RemoteServer:
    """A server specbench did not start: it is only asked things, never started or stopped."""

    def __init__(self, url: str, headers: dict | None) -> None:
        self.url = base_url(url)
        self.headers = headers or {}
        self.log_path = None

    def get(self, path: str, timeout_s: float = 10.0) -> str:
        request = urllib.request.Request(self.url + path, headers=self.headers)
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read().decode()

    def healthy(self, timeout_s: float = 10.0) -> bool:
        try:
            self.get("/v1/models", timeout_s)
            return True
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def process_tree(self) -> list:
        return []

    def model_id(self) -> str:
        """The first model the server lists; a one-line error when it cannot be reached."""
        try:
            listed = json.loads(self.get("/v1/models"))
        except urllib.error.HTTPError as error:
            hint = " (set the API key's variable, --api-key-env)" if error.code in (401, 403) else ""
            raise ModelNotAvailable(f"{self.url}/v1/models answered HTTP {error.code}{hint}") from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise ModelNotAvailable(f"cannot reach the endpoint {self.url}: {reason}") from None
        models = [entry.get("id") for entry in listed.get("data", []) if entry.get("id")]
        if not models:
            raise ModelNotAvailable(f"{self.url}/v1/models lists no model")
        return models[0]

    def context_limit(self) -> int:
        """The context its first model is served with (vLLM's and SGLang's /v1/models say max_model_len);
        0 where it does not say or cannot be asked."""
        try:
            listed = json.loads(self.get("/v1/models"))
            return max(0, int(listed["data"][0].get("max_model_len") or 0))
        except Exception:
            return 0

    def scrape(self, only: tuple[str, ...] = ()) -> Snapshot:
        """Its /metrics (`only` the metrics with these prefixes), or an empty snapshot where it has none."""
        try:
            return Snapshot.parse(self.get("/metrics"), only)
        except Exception:
            return Snapshot([])

    def server_info(self) -> dict:
        """SGLang's /server_info ({} elsewhere)."""
        for path in ("/server_info", "/get_server_info"):
            try:
                return json.loads(self.get(path))
            except Exception:
                continue
        return {}


class RemoteFleet:
    """The servers one load is spread over (one, or several of the same model), asked as one: its
    metrics are theirs summed (each series labelled with its server's number), a request that needs
    one server (scoring, a logit gap) goes to the first."""

    def __init__(self, urls: list[str], headers: dict | None) -> None:
        self.servers = [RemoteServer(url, headers) for url in urls]
        self.urls = [server.url for server in self.servers]
        self.url = self.urls[0]
        self.label = ",".join(self.urls)
        self.log_path = None

    def healthy(self, timeout_s: float = 10.0) -> bool:
        return all(server.healthy(timeout_s) for server in self.servers)

    def process_tree(self) -> list:
        return []

    def model_id(self) -> str:
        """The model every server lists first; a one-line error where one cannot be reached or they differ."""
        models = {server.url: server.model_id() for server in self.servers}
        if len(set(models.values())) > 1:
            raise ValueError("the servers of one --endpoint list serve different models ("
                             + ", ".join(f"{url}: {name}" for url, name in models.items()) + ")")
        return next(iter(models.values()))

    def context_limit(self) -> int:
        """The smallest context its servers say they serve (0: none says)."""
        return smallest_known(server.context_limit() for server in self.servers)

    def scrape(self, only: tuple[str, ...] = ()) -> Snapshot:
        return Snapshot.merged([server.scrape(only) for server in self.servers])

    def server_info(self) -> dict:
        return self.servers[0].server_info()

    def kv_caches(self) -> list[dict]:
        """What each server's vLLM says of its KV cache (nothing where it does not): the fleet
        simulator's replica."""
        return [{key: value for key, value in kv_cache_labels(server.scrape(("vllm:cache_config_info",))).items()
                 if value not in (None, "", "None")} for server in self.servers]


class EndpointEngine(ServedEngine):
    """Servers the user runs: asked, never started or stopped."""

    name = "endpoint"

    def __init__(self, config: SweepConfig, run_dir: Path, replay: Replay | None = None) -> None:
        super().__init__(config, run_dir, replay)
        self.headers = api_headers(config)
        endpoints = config.engine.endpoint
        self.endpoint = RemoteFleet(endpoint_urls(endpoints.urls), self.headers) if endpoints.urls else None
        self.baseline = RemoteFleet(endpoint_urls(endpoints.baseline_urls), self.headers) \
            if endpoints.baseline_urls else None
        self.served_names: dict[str, str] = {}

    def open(self) -> str:

        config = self.config
        for fleet in filter(None, (self.endpoint, self.baseline)):
            self.served_names[fleet.label] = fleet.model_id()
        names = set(self.served_names.values())
        if len(names) > 1:
            raise ValueError(f"the endpoints serve different models ({', '.join(sorted(names))}): the baseline "
                             f"must serve the target the speculative server verifies with")
        self.served_name = names.pop()
        try:  # the target's tokenizer gives the prompts' token ids (and the chat template)
            self.target_dir = model_path(config.grid.target, config)  # resolves it; a one-line error if missing
            self.tokenizer = load_tokenizer(self.target_dir, allow_download=config.engine.allow_download,
                                            trust_remote_code=config.engine.trust_remote_code)
        except ModelNotAvailable as error:
            raise ModelNotAvailable(f"--target {config.grid.target}: the endpoint's tokenizer is needed to send every "
                                    f"server the same token ids ({error})") from None
        self._probe_scoring()
        if self.baseline:
            self.pairing, self.pairing_reason = SIDE_BY_SIDE, "both endpoints are up"
        if self.endpoint is None:
            pair = "; no --endpoint: the baseline alone, no speed-ups"
        elif self.baseline:
            pair = f"; baseline {self.baseline.label}, repeats side by side"
        else:
            pair = "; no --baseline-endpoint: no speed-ups"
        several = any(len(fleet.servers) > 1 for fleet in (self.endpoint, self.baseline) if fleet is not None)
        routed = f"; each load spread over its servers ({config.engine.endpoint.router})" if several else ""
        return (f"endpoint {(self.endpoint or self.baseline).label} serving {self.served_name!r}{pair}; prompts "
                f"tokenized with {config.grid.target}; sampled check: "
                f"{'on' if self.scores_samples else self.scores_samples_note}{routed}")

    def _probe_scoring(self) -> None:
        """The sampled check scores outputs with prompt log-probabilities, a vLLM extension."""
        self.current = self.baseline or self.endpoint
        try:
            body = self._complete({"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1})
            ok = bool(body["choices"][0].get("prompt_logprobs"))
        except Exception:
            ok = False
        self.scores_samples = ok
        self.scores_samples_note = "" if ok else ("not checked: the server returns no prompt log-probabilities "
                                                  "(vLLM's prompt_logprobs) to score sampled outputs with")

    def close(self) -> None:
        self.current = None

    def stages(self, cells: list[Cell]) -> list[Stage]:
        baseline = [cell for cell in cells if not cell.is_speculative]
        speculative = [cell for cell in cells if cell.is_speculative]
        stages = []
        if baseline:
            stages.append(EndpointStage(self, self.baseline, "baseline endpoint", baseline))
        if speculative:
            stages.append(EndpointStage(self, self.endpoint, "endpoint", speculative))
        return stages

    def annotate(self, meta: dict) -> None:
        servers = [{"label": label, "url": url, "kv_cache": kv}
                   for label, fleet in (("endpoint", self.endpoint), (AR, self.baseline)) if fleet is not None
                   for url, kv in zip(fleet.urls, _quietly(fleet.kv_caches, [{}] * len(fleet.urls)))]
        context = smallest_known(fleet.context_limit() for fleet in (self.endpoint, self.baseline) if fleet)
        meta["engine"] = {"name": self.name, "endpoint": self.endpoint.label if self.endpoint else "",
                          "served_model": self.served_name, "context_limit": context,
                          "baseline_endpoint": self.baseline.label if self.baseline else "", "pairing": self.pairing,
                          "router": self.config.engine.endpoint.router, "servers": servers,
                          "api_key_env": self.config.engine.endpoint.api_key_env, "api_key_sent": bool(self.headers)}
        shapes = self.architectures()
        if shapes:
            meta["architectures"] = shapes


class EndpointStage(Stage):
    """Cells measured on a running server; nothing to set up or tear down."""

    def __init__(self, engine: EndpointEngine, server: RemoteFleet, label: str, cells: list[Cell]) -> None:
        super().__init__(f"{label} {server.label}", [[cell] for cell in cells])
        self.engine, self.server = engine, server
        self.kv_cache: dict = {}
        self.record = None

    def __enter__(self) -> "EndpointStage":
        self.engine.current = self.server
        return self

    def __exit__(self, *exc) -> None:
        self.engine.current = None

    def scrape(self, only: tuple[str, ...] = ()) -> Snapshot:
        return self.server.scrape(only)

    def failure_note(self) -> str:
        return f"endpoint {self.server.label}" + ("" if self.server.healthy() else ", which no longer answers")

    def measurement(self, cell: Cell, prompts, prompt_ids) -> "EndpointCellRun":
        """A speculative cell alternates its repeats with the baseline endpoint's (side by side)."""
        run = EndpointCellRun(self, cell, prompts, prompt_ids)
        baseline = self.engine.baseline
        if cell.is_speculative and baseline is not None:
            stage = EndpointStage(self.engine, baseline, "baseline endpoint", [])
            run.companion = EndpointCellRun(stage, replace(cell, draft=AR, k=0, alpha=""), prompts, prompt_ids)
        return run


class EndpointCellRun(ServedCellRun):
    """A cell on a running server: the served measurement, with the endpoint it measured; memory
    is not seen from outside (NaN), and acceptance comes from whichever metrics the server has."""

    def payload(self, prompt: list[int], index: int, repeat: int, max_tokens: int) -> dict:
        payload = super().payload(prompt, index, repeat, max_tokens)
        payload["stream_options"] = {"include_usage": True}  # token counts from servers that stream only text
        return payload

    def engine_columns(self) -> dict:
        unseen = float("nan")  # the server's processes are on another machine, or not specbench's
        return {"endpoint": self.stage.server.label, "peak_memory_bytes": unseen, "memory_kind": "",
                "target_param_bytes": unseen, "target_kv_cache_bytes": unseen, "draft_param_bytes": unseen,
                "draft_kv_cache_bytes": unseen, "draft_memory_bytes": unseen}

    def acceptance_columns(self) -> dict:
        """vLLM's spec-decode counters where the server has them, else SGLang's gauges or its
        /server_info, else unknown; `acceptance_source` says which."""
        if self.counters.get(COUNTERS[0], 0.0) > 0:
            return {**super().acceptance_columns(), "acceptance_source": "vllm:spec_decode counters"}
        columns = {"alpha": float("nan"), "tau": float("nan"), "drafted": 0, "accepted": 0, "num_drafts": 0,
                   "rejections": 0, "acceptance_by_position": [], "k_drafted_mean": float("nan")}
        after = self.stage.scrape()
        length = after.find(SGLANG_ACCEPT_LENGTH)
        rate = after.find(SGLANG_ACCEPT_RATE)
        if length or rate:
            return columns | {"tau": length[0].value if length else float("nan"),
                              "alpha": rate[0].value if rate else float("nan"),
                              "acceptance_source": "sglang gauges (the server's recent window, not this cell alone)"}
        found = _find_key(self.stage.server.server_info(), "avg_spec_accept_length")
        if found is not None and math.isfinite(found):
            return columns | {"tau": found, "acceptance_source": "sglang /server_info avg_spec_accept_length (over "
                                                                 "the server's life)"}
        return columns | {"acceptance_source": "unknown: the server exposes no speculative-decoding metrics"}


def _quietly(read, otherwise):
    """`read()`, or `otherwise` where the server does not answer it (what it tells is optional)."""
    try:
        return read()
    except Exception:
        return otherwise


def _find_key(data, key: str) -> float | None:
    """The first value of `key` anywhere in a JSON document (SGLang nests it per scheduler)."""
    if isinstance(data, dict):
        if key in data:
            try:
                return float(data[key])
            except (TypeError, ValueError):
                return None
        data = list(data.values())
    if isinstance(data, list):
        for item in data:
            found = _find_key(item, key)
            if found is not None:
                return found
    return None

