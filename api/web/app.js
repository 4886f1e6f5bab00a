// pdplan planner page: a form, the REST API's answers, and plots of them.
// The page formats what /v1/plan, /v1/sweep and /v1/evaluate return; it computes no figure itself.
// The form's state lives in the query string, so a link reopens (and reruns) the same plan.
"use strict";

(() => {
  const MODES = ["mixed", "chunked", "disaggregated"];
  const MODE_COLOURS = { mixed: "#1f77b4", chunked: "#e07b00", disaggregated: "#2a9d4b" };
  const BEST_COLOUR = "#7a3db8";
  const SCALING_FACTORS = [0.25, 0.5, 1, 2, 4];  // sweep rates, as multiples of the planned rate
  const LOAD_FRACTIONS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3];  // of the capacity
  const DEFAULTS = {
    source: "catalog", model: "llama-3.1-70b", hf: "", gpus: ["h100-sxm", "h200-sxm"],
    rate: "4", isl: "4000", isl_cv: "0", osl: "500", osl_cv: "0", prefix_hit: "0",
    ttft_s: "2", tpot_ms: "50", percentile: "90", itl_ms: "", attainment: "per_metric",
    modes: MODES.slice(), objective: "gpus", scheduler: "hybrid", weight_dtype: "bf16", kv_dtype: "bf16",
    engine: "generic",
  };
  const ALWAYS_IN_URL = ["model", "gpus", "rate", "isl", "osl", "ttft_s", "tpot_ms"];
  const NUMBER_FIELDS = [  // [state key = input id = query parameter, API path, label, unit, fieldset]
    ["rate", "workload.rate", "Rate", "req/s", "workload"],
    ["prefix_hit", "workload.prefix_hit", "Prefix-cache hit", "0–1", "workload"],
    ["isl", "workload.isl", "Prompt length", "tokens", "workload"],
    ["isl_cv", "workload.isl.cv", "Prompt spread", "cv", "workload"],
    ["osl", "workload.osl", "Output length", "tokens", "workload"],
    ["osl_cv", "workload.osl.cv", "Output spread", "cv", "workload"],
    ["ttft_s", "slo.ttft_s", "TTFT", "s", "slo"],
    ["tpot_ms", "slo.tpot_s", "TPOT", "ms", "slo"],
    ["percentile", "slo.percentile", "Percentile", "%", "slo"],
    ["itl_ms", "slo.itl_s", "ITL", "ms, optional", "slo"],
  ];
  const API_PATH = Object.fromEntries(NUMBER_FIELDS.map(([key, path]) => [key, path]));
  const PER_API_UNIT = (key) => (key.endsWith("_ms") ? 1000 : 1);  // the form's ms, the API's seconds
  const INPUTS = {  // state key -> input id
    ...Object.fromEntries(NUMBER_FIELDS.map(([key]) => [key, key])), model: "model", hf: "hf-config",
    attainment: "attainment", objective: "objective", scheduler: "scheduler", weight_dtype: "weight-dtype",
    kv_dtype: "kv-dtype", engine: "engine",
  };

  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
  const catalog = { models: new Map(), gpus: new Map() };
  const charts = {};
  let planRun = 0;            // id of the latest plan; older answers are dropped
  let planAbort = null;       // AbortController of the latest plan and its follow-up requests
  let loadAbort = null;       // AbortController of the load curves (a row click restarts them)
  let current = null;         // {state, body, plan}

  // ------------------------------------------------------------------ formatting

  const sig = (x, digits = 3) => (x == null || !Number.isFinite(x)) ? "–"
    : Number(x).toLocaleString("en-US", { maximumSignificantDigits: digits });
  const fixed = (x, digits) => (x == null || !Number.isFinite(x)) ? "–"
    : Number(x).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  const money = (x) => "$" + fixed(x, 2);
  const ms = (s) => sig(s * 1e3);
  const pct = (x) => (x == null || !Number.isFinite(x)) ? "–" : `${Math.round(x * 100)}%`;
  const round3 = (x) => Number(x.toPrecision(3));
  const up3 = (x) => {  // rounded up to 3 significant digits: a target that stays on the feasible side
    const unit = 10 ** (Math.floor(Math.log10(x)) - 2);
    return Number((Math.ceil(x / unit - 1e-9) * unit).toPrecision(3));
  };

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c != null && c !== false) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function poolText(p) {
    return `${p.instances} × ${p.gpu}, tp ${p.tp}` + (p.pp > 1 ? `, pp ${p.pp}` : "");
  }

  function describe(d) {
    if (d.mode === "disaggregated") return `${poolText(d.prefill)} prefill + ${poolText(d.decode)} decode`;
    return poolText(d.pool) + (d.mode === "chunked" ? `, chunk ${d.chunk_tokens}` : "");
  }

  // ------------------------------------------------------------------ the API

  class ApiError extends Error {
    constructor(status, body) {
      super(typeof body?.detail === "string" ? body.detail : `HTTP ${status}`);
      this.status = status;
      this.body = body;
    }
  }

  async function api(path, body, signal) {
    const init = body === undefined ? { signal } : {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), signal,
    };
    const r = await fetch(path, init);
    let data = null;
    try { data = await r.json(); } catch { data = null; }
    if (!r.ok) throw new ApiError(r.status, data);
    return data;
  }

  function limiter(n) {  // at most n requests at once: the server computes 4 at a time per process
    let active = 0;
    const waiting = [];
    const next = () => {
      if (active >= n || !waiting.length) return;
      active += 1;
      const { fn, resolve, reject } = waiting.shift();
      fn().then(resolve, reject).finally(() => { active -= 1; next(); });
    };
    return (fn) => new Promise((resolve, reject) => { waiting.push({ fn, resolve, reject }); next(); });
  }
  const queue = limiter(2);

  // ------------------------------------------------------------------ catalog

  async function loadCatalog() {
    const [models, gpus, engines] = await Promise.all([api("/v1/models"), api("/v1/gpus"), api("/v1/engines")]);
    for (const e of engines) {
      if (e.id === "generic") continue;  // the page's own first option
      $("#engine").append(el("option", { value: e.id, title: e.fitted_on || null },
                             `${e.id} (${e.engine} ${e.version}, fitted on ${Object.keys(e.gpus).join(", ")})`));
    }
    const list = $("#model-list");
    for (const m of models) {
      catalog.models.set(m.spec.id, m);
      list.append(el("option", { value: m.spec.id, label: `${m.spec.name} · ${sig(m.param_count / 1e9)} B` }));
    }
    for (const g of gpus) {
      catalog.gpus.set(g.id, g);
      $("#gpu-list").append(gpuOption(g.id, g));
    }
    api("/v1/version").then((v) => { $("#version").textContent = `v${v.version} · ${v.gpus} GPUs, ${v.models} models`; },
      () => {});
  }

  function gpuOption(id, g) {
    const meta = g ? `${sig(g.hbm_gb)} GB · ${money(g.price_usd_per_hour)}/h` : "not in the catalog";
    return el("label", { class: g ? null : "unknown", title: g ? g.name : null },
      el("input", { type: "checkbox", name: "gpu", value: id }),
      el("span", { class: "gpu-id", text: id }),
      el("span", { class: "gpu-meta", text: meta }),
      g ? el("span", { class: "gpu-name", text: g.name }) : null);
  }

  function showModelInfo() {
    const m = catalog.models.get($("#model").value.trim());
    const spec = m?.spec;
    $("#model-info").textContent = spec ? [
      `${sig(m.param_count / 1e9)} B parameters` + (m.active_param_count < m.param_count
        ? ` (${sig(m.active_param_count / 1e9)} B active)` : ""),
      `context ${spec.max_position_embeddings.toLocaleString("en-US")} tokens`,
      `KV ${sig(m.kv_bytes_per_token_bf16 / 1024)} KiB/token (bf16)`,
    ].join(" · ") : "";
  }

  // ------------------------------------------------------------------ form state <-> query string

  function readForm() {
    const s = { source: $("input[name=model-source]:checked").value };
    for (const [key, id] of Object.entries(INPUTS)) s[key] = document.getElementById(id).value.trim();
    s.gpus = $$("#gpu-list input:checked").map((i) => i.value);
    s.modes = $$("#modes input:checked").map((i) => i.value);
    return s;
  }

  function writeForm(s) {
    for (const r of $$("input[name=model-source]")) r.checked = r.value === s.source;
    showSource();
    for (const [key, id] of Object.entries(INPUTS)) document.getElementById(id).value = s[key] ?? "";
    for (const id of s.gpus) {
      if (!$$("#gpu-list input").some((i) => i.value === id)) $("#gpu-list").prepend(gpuOption(id, null));
    }
    for (const i of $$("#gpu-list input")) i.checked = s.gpus.includes(i.value);
    for (const i of $$("#modes input")) i.checked = s.modes.includes(i.value);
    showModelInfo();
  }

  function toQuery(s) {
    const q = new URLSearchParams();
    const list = (key) => ["gpus", "modes"].includes(key);
    for (const key of Object.keys(DEFAULTS)) {
      if (key === "model" && s.source === "hf") continue;
      if (key === "hf" && s.source !== "hf") continue;
      const value = list(key) ? s[key].join(",") : s[key];
      const dflt = list(key) ? DEFAULTS[key].join(",") : DEFAULTS[key];
      if (key === "hf") q.set("hf", compactJson(value));
      else if (ALWAYS_IN_URL.includes(key) || value !== dflt) q.set(key, value);
    }
    return q;
  }

  function fromQuery(q) {
    const s = structuredClone(DEFAULTS);
    for (const key of Object.keys(DEFAULTS)) {
      if (!q.has(key)) continue;
      const v = q.get(key);
      s[key] = ["gpus", "modes"].includes(key) ? v.split(",").map((x) => x.trim()).filter(Boolean) : v;
    }
    if (q.has("hf")) s.source = "hf";
    return s;
  }

  function compactJson(text) {
    try { return JSON.stringify(JSON.parse(text)); } catch { return text; }
  }

  function showSource() {
    const source = $("input[name=model-source]:checked").value;
    for (const block of $$("[data-source]")) block.hidden = block.dataset.source !== source;
  }

  // ------------------------------------------------------------------ request and field errors

  function buildPlan(s) {
    const errors = [];
    const num = (key, optional = false) => {
      const text = s[key];
      const path = API_PATH[key];
      if (text === "" || text == null) {
        if (!optional) errors.push({ path, msg: "a number is required" });
        return undefined;
      }
      const x = Number(text);
      if (!Number.isFinite(x)) { errors.push({ path, msg: `not a number: ${text}` }); return undefined; }
      return x / PER_API_UNIT(key);
    };
    let model = s.model;
    if (s.source === "hf") {
      try {
        const config = JSON.parse(s.hf);
        if (config === null || typeof config !== "object" || Array.isArray(config)) throw new Error("not a JSON object");
        model = { hf_config: config };
      } catch (e) {
        errors.push({ path: "model.hf_config", msg: `config.json is not valid JSON: ${e.message}` });
      }
    } else if (!model) {
      errors.push({ path: "model", msg: "choose a model id from the catalog" });
    }
    const length = (key) => ({ mean: num(key), cv: num(`${key}_cv`) });
    const slo = { ttft_s: num("ttft_s"), tpot_s: num("tpot_ms"), percentile: num("percentile"), attainment: s.attainment };
    const itl = num("itl_ms", true);
    if (itl !== undefined) slo.itl_s = itl;
    const body = {
      model,
      workload: { rate: num("rate"), isl: length("isl"), osl: length("osl"), prefix_hit: num("prefix_hit") },
      slo, objective: s.objective, scheduler: s.scheduler, weight_dtype: s.weight_dtype, kv_dtype: s.kv_dtype,
      engine: s.engine || "generic",
    };
    if (s.gpus.length) body.gpus = s.gpus;
    if (s.modes.length) body.modes = s.modes;
    else errors.push({ path: "modes", msg: "tick at least one mode" });
    return { body, errors };
  }

  function clearErrors() {
    for (const e of $$(".field-error")) e.remove();
    for (const e of $$(".invalid")) e.classList.remove("invalid");
    for (const id of ["#form-error", "#catalog-error"]) { $(id).hidden = true; $(id).textContent = ""; }
  }

  function fieldFor(path) {  // the visible form element whose data-path is the longest prefix of path
    let best = null;
    for (const node of $$("#plan-form [data-path]")) {
      if (node.closest("[hidden]")) continue;
      const p = node.dataset.path;
      if ((path === p || path.startsWith(p + ".")) && (!best || p.length > best.dataset.path.length)) best = node;
    }
    return best;
  }

  function showFieldError(path, msg, suggestions = [], onPick = null) {
    const field = fieldFor(path);
    const rest = field ? path.slice(field.dataset.path.length + 1) : "";  // the part no input of its own shows
    const box = el("p", { class: "field-error", role: "alert", "data-error-for": path }, rest ? `${rest}: ${msg}` : msg);
    if (suggestions.length) {
      box.append(el("br"), "Did you mean: ");
      for (const id of suggestions) {
        box.append(el("button", { type: "button", class: "suggestion", text: id, onclick: () => onPick(id) }));
      }
    }
    if (!field) {
      $("#form-error").hidden = false;
      $("#form-error").append(box);
      return;
    }
    field.classList.add("invalid");
    if (field.tagName === "DETAILS") field.open = true;
    field.closest("details")?.setAttribute("open", "");
    field.append(box);
  }

  function showApiError(err, state) {
    const body = err.body;
    if (err.status === 422 && Array.isArray(body?.detail)) {
      for (const item of body.detail) {
        const loc = item.loc[0] === "body" ? item.loc.slice(1) : item.loc;
        const path = loc.join(".");
        const msKey = NUMBER_FIELDS.map(([key]) => key).find((key) => PER_API_UNIT(key) !== 1 && path === API_PATH[key]);
        const note = msKey ? ` (sent in seconds: ${state[msKey]} ms = ${Number(state[msKey]) / 1000} s)` : "";
        showFieldError(path || "body", item.msg + note);
      }
      return;
    }
    if (err.status === 404 && body && Array.isArray(body.closest)) {
      const gpu = /\bGPU id '([^']*)'/.exec(body.detail);  // unknown or ambiguous; else it is the model's id
      if (gpu) {
        showFieldError("gpus", body.detail, body.closest, (id) => {
          const s = readForm();
          s.gpus = s.gpus.filter((g) => g !== gpu[1]).concat(s.gpus.includes(id) ? [] : [id]);
          writeForm(s);
          submit();
        });
      } else {
        showFieldError("model", body.detail, body.closest, (id) => { $("#model").value = id; showModelInfo(); submit(); });
      }
      return;
    }
    const detail = typeof body?.detail === "string" ? body.detail : err.message;
    $("#form-error").hidden = false;
    $("#form-error").textContent = `The server answered ${err.status}: ${detail}`;
  }

  // ------------------------------------------------------------------ planning

  function submit(push = true) {
    runPlan(readForm(), push);
  }

  async function runPlan(state, push) {
    planAbort?.abort();
    loadAbort?.abort();
    const ctl = new AbortController();
    planAbort = ctl;
    const run = ++planRun;
    clearErrors();
    const { body, errors } = buildPlan(state);
    const url = `${location.pathname}?${toQuery(state)}`;
    if (url !== location.pathname + location.search) history[push ? "pushState" : "replaceState"](null, "", url);
    if (errors.length) {
      for (const e of errors) showFieldError(e.path, e.msg);
      setStatus("error", "Fix the highlighted fields.");
      return;
    }
    setStatus("running", "Planning…");
    const t0 = performance.now();
    let answer;
    try {
      answer = await api("/v1/plan", body, ctl.signal);
    } catch (err) {
      if (err.name === "AbortError" || run !== planRun) return;
      if (err instanceof ApiError) showApiError(err, state);
      else { $("#form-error").hidden = false; $("#form-error").textContent = `The server could not be reached: ${err.message}`; }
      setStatus("error", "No plan: the form shows what to fix.");
      return;
    }
    if (run !== planRun) return;
    const plan = answer.plan;
    current = { state, body, plan, signal: ctl.signal };
    $("#intro").hidden = true;
    $("#output").hidden = false;
    renderRecommendation(plan);
    renderExplanation(answer.explanation);
    renderCandidates(plan);
    setStatus("done", `Planned in ${sig((performance.now() - t0) / 1e3, 2)} s · ${plan.searched.toLocaleString("en-US")} configurations searched`);
    renderPareto(plan);
    loadScaling(body, plan, run, ctl.signal);
    if (plan.best) loadCurves(plan.best, 0);
    else {
      for (const id of ["fig-ttft", "fig-tpot"]) figureState(id, "empty", "No deployment meets the SLO, so there is none to load.");
    }
  }

  function setStatus(status, text) {
    $("#result").dataset.status = status;
    $("#run-status").textContent = text;
    $("#submit").disabled = status === "running";
  }

  // ------------------------------------------------------------------ recommendation, explanation, table

  function renderRecommendation(plan) {
    const box = $("#recommendation");
    box.replaceChildren();
    const p = plan.slo.percentile;
    if (!plan.feasible || !plan.best) {
      box.append(el("h2", { text: "No deployment meets the SLO" }), el("p", { text: plan.reason || "" }));
      const near = plan.nearest_feasible_slo;
      if (near) {
        box.append(el("p", {},
          `Nearest SLO that a deployment meets: p${sig(near.percentile)} TTFT ${sig(near.ttft_s)} s, TPOT ${ms(near.tpot_s)} ms. `,
          el("button", { type: "button", class: "secondary", text: "Plan with this SLO", onclick: () => {
            $("#ttft_s").value = String(up3(near.ttft_s));
            $("#tpot_ms").value = String(up3(near.tpot_s * 1e3));
            submit();
          } })));
      }
      return;
    }
    const b = plan.best;
    const d = b.deployment;
    const kpi = (value, name, cls) => el("div", { class: `kpi ${cls || ""}` },
      el("div", { class: "value", text: value }), el("div", { class: "name", text: name }));
    box.append(
      el("div", { class: "head" },
        el("h2", {}, "Recommended: ", el("span", { class: `badge ${b.mode}`, text: b.mode })),
        el("span", { class: "muted", text: `${plan.model} · ${sig(plan.workload.rate)} req/s · objective: ${objectiveText(plan.objective)}` })),
      el("div", { class: "kpis" },
        kpi(String(b.num_gpus), "GPUs"),
        kpi(String(b.nodes), "8-GPU nodes"),
        kpi(money(b.cost_per_hour), "$ per hour"),
        kpi(money(b.cost_per_million_tokens), "$ per 1M output tokens"),
        kpi(`${sig(b.ttft_p_s)} s`, `p${sig(p)} TTFT (SLO ${sig(plan.slo.ttft_s)} s)`, "ok"),
        kpi(`${ms(b.tpot_p_s)} ms`, `p${sig(p)} TPOT (SLO ${ms(plan.slo.tpot_s)} ms)`, "ok")),
      el("div", { class: "pools" }, ...poolCards(d)),
      el("p", { class: "facts" },
        "What binds: ", el("b", { text: b.binding }),
        " · utilisation ", el("b", { text: pct(b.utilisation) }),
        " · capacity ", el("b", { text: `${sig(b.capacity_rps)} req/s` }),
        d.mode === "disaggregated" ? [" · KV move ", el("b", { text: `${ms(b.kv_transfer_s)} ms` })] : null,
        " · ", el("b", { text: `${sig(b.output_tokens_per_s_per_gpu)} tok/s/GPU` }),
        ", ", el("b", { text: `${sig(b.tokens_per_s_per_user)} tok/s/user` })));
  }

  function objectiveText(o) {
    return { gpus: "fewest GPUs", cost: "lowest $/h", cost_per_token: "lowest $/1M tokens" }[o] || o;
  }

  function poolCards(d) {
    const card = (cls, title, p, extra) => el("div", { class: `pool ${cls}` },
      el("h4", { text: title }),
      el("div", { class: "line" }, el("b", { text: `${p.instances} × ${p.gpu}` }), `, tp ${p.tp}` + (p.pp > 1 ? `, pp ${p.pp}` : "")),
      el("div", { class: "muted", text: [`${p.tp * p.pp * p.instances} GPUs`, `${p.weight_dtype} weights, ${p.kv_dtype} KV`, ...extra].join(" · ") }));
    if (d.mode === "disaggregated") {
      return [card("prefill", "Prefill pool", d.prefill, []),
              card("decode", "Decode pool", d.decode, [`max batch ${d.decode.max_batch}`])];
    }
    const extra = [`max batch ${d.pool.max_batch}`,
      d.mode === "chunked" ? `chunk budget ${d.chunk_tokens} tokens` : `scheduler ${d.scheduler}`];
    return [card(d.mode, `${d.mode === "chunked" ? "Chunked-prefill" : "Mixed"} pool (prefill and decode together)`, d.pool, extra)];
  }

  function renderExplanation(text) {
    $("#explanation").replaceChildren(...text.split("\n").filter(Boolean).map((line) => el("p", { text: line })));
  }

  function columns(plan) {
    const p = `p${sig(plan.slo.percentile)}`;
    return [
      { head: "Mode and deployment", cls: "text deployment", fn: (c) => deploymentCell(c.deployment) },
      { head: "GPUs", fn: (c) => String(c.num_gpus) },
      { head: "$/h", fn: (c) => money(c.cost_per_hour) },
      { head: "$/1M tokens", fn: (c) => money(c.cost_per_million_tokens) },
      { head: `${p} TTFT (s)`, fn: (c) => sig(c.ttft_p_s) },
      { head: `${p} TPOT (ms)`, fn: (c) => ms(c.tpot_p_s) },
      { head: "Util.", fn: (c) => pct(c.utilisation) },
      { head: "Capacity (req/s)", fn: (c) => sig(c.capacity_rps) },
      { head: "tok/s/GPU", fn: (c) => sig(c.output_tokens_per_s_per_gpu) },
      { head: "tok/s/user", fn: (c) => sig(c.tokens_per_s_per_user) },
      { head: "What binds", cls: "text binds", fn: (c) => c.binding },
    ];
  }

  function deploymentCell(d) {  // the mode, then each pool on a line of its own that does not break
    const badge = el("span", { class: `badge ${d.mode}`, text: d.mode });
    const line = (...parts) => el("span", { class: "nowrap" }, ...parts);
    if (d.mode !== "disaggregated") {
      return [badge, el("br"), line(poolText(d.pool)), d.mode === "chunked" ? [", ", line(`chunk ${d.chunk_tokens}`)] : null];
    }
    return [badge, el("br"), line(el("span", { class: "pool-role", text: "prefill " }), poolText(d.prefill)), el("br"),
      line(el("span", { class: "pool-role", text: "decode " }), poolText(d.decode))];
  }

  function renderCandidates(plan) {
    const cols = columns(plan);
    $("#candidates thead").replaceChildren(el("tr", {}, cols.map((c) => el("th", { class: c.cls, scope: "col", text: c.head }))));
    const rows = plan.candidates.map((c, i) => el("tr", {
      class: c === plan.best || i === 0 ? "best selected" : null, "data-index": String(i),
      title: "Plot TTFT and TPOT against load for this deployment", onclick: () => loadCurves(c, i),
    }, cols.map((col) => el("td", { class: col.cls }, col.fn(c)))));
    $("#candidates tbody").replaceChildren(...rows);
    $("#candidates-note").textContent = plan.candidates.length
      ? `${plan.candidates.length} shown, best of each mode first; click a row to plot its latency against load`
      : "none meets the SLO";
  }

  // ------------------------------------------------------------------ charts

  const logTicks = (value) => {
    const m = value / 10 ** Math.floor(Math.log10(value) + 1e-9);
    return [1, 2, 5].some((k) => Math.abs(m - k) < 1e-6) ? sig(value) : "";
  };

  const markers = {  // dashed reference lines: options.plugins.markers = [{axis, value, label, colour}]
    id: "markers",
    afterDatasetsDraw(chart, _args, opts) {
      const { ctx, chartArea: a, scales } = chart;
      for (const m of opts.lines || []) {
        const scale = m.axis === "x" ? scales.x : scales.y;
        const pos = scale.getPixelForValue(m.value);
        if (!Number.isFinite(pos) || pos < (m.axis === "x" ? a.left : a.top) - 1 || pos > (m.axis === "x" ? a.right : a.bottom) + 1) continue;
        ctx.save();
        ctx.strokeStyle = m.colour || "#555";
        ctx.fillStyle = m.colour || "#555";
        ctx.setLineDash([6, 4]);
        ctx.lineWidth = 1.5;
        ctx.beginPath();
        if (m.axis === "x") { ctx.moveTo(pos, a.top); ctx.lineTo(pos, a.bottom); } else { ctx.moveTo(a.left, pos); ctx.lineTo(a.right, pos); }
        ctx.stroke();
        ctx.setLineDash([]);
        ctx.font = "12px " + Chart.defaults.font.family;
        if (m.axis === "y") { ctx.textAlign = "right"; ctx.fillText(m.label, a.right - 4, pos - 4); } else {
          const right = pos + ctx.measureText(m.label).width + 8 > a.right;  // label on the side with room
          ctx.textAlign = right ? "right" : "left";
          ctx.fillText(m.label, right ? pos - 4 : pos + 4, a.bottom - 6);
        }
        ctx.restore();
      }
    },
  };

  function axis(title, type = "linear", extra = {}) {
    return {
      type, title: { display: true, text: title, font: { weight: "600" } },
      ticks: type === "logarithmic" ? { callback: logTicks, autoSkip: false, maxRotation: 0 } : { maxRotation: 0 },
      grid: { color: "#e9edf2" }, ...extra,
    };
  }

  function figureState(id, status, note = "") {
    const fig = document.getElementById(id);
    fig.dataset.status = status;
    $(".chart-note", fig).textContent = note;
    if (status === "empty" || status === "error") {
      charts[id]?.destroy();
      delete charts[id];
      fig.dataset.points = "0";
    }
  }

  function draw(id, config, note) {
    const fig = document.getElementById(id);
    if (!window.Chart) { figureState(id, "error", "The chart library (/ui/vendor/chart.umd.js) did not load."); return; }
    charts[id]?.destroy();
    config.options = {
      responsive: true, maintainAspectRatio: false, animation: false, parsing: true,
      interaction: { mode: "nearest", intersect: true },
      ...config.options,
      plugins: { legend: { position: "bottom", labels: { boxWidth: 14, usePointStyle: true } }, ...config.options.plugins },
    };
    fig.dataset.status = "loading";  // the canvas box is shown (an empty figure hides it) before Chart.js sizes it
    charts[id] = new Chart($("canvas", fig), { plugins: [markers], ...config });
    fig.dataset.points = String(config.data.datasets.reduce((n, ds) => n + ds.data.filter((p) => p && p.y != null).length, 0));
    figureState(id, "ready", note);
  }

  const pointLabel = (ctx) => ctx.raw.label ? [ctx.raw.label, ctx.raw.text] : ctx.raw.text;

  function renderPareto(plan) {
    const id = "fig-pareto";
    if (!plan.pareto.length) { figureState(id, "empty", "No Pareto points: no configuration meets the SLO."); return; }
    const point = (x, y, label, text) => ({ x, y, label, text });
    const frontier = plan.pareto.slice().sort((a, b) => a.tokens_per_s_per_user - b.tokens_per_s_per_user)
      .map((q) => ({ ...point(q.tokens_per_s_per_user, q.output_tokens_per_s_per_gpu, q.label,
        `${sig(q.output_tokens_per_s_per_gpu)} tok/s/GPU at ${sig(q.tokens_per_s_per_user)} tok/s/user`
        + (q.meets_slo ? "" : "; misses the SLO")), meets: q.meets_slo }));
    const cand = (c) => point(c.tokens_per_s_per_user, c.output_tokens_per_s_per_gpu, describe(c.deployment),
      `${c.num_gpus} GPUs · ${sig(c.output_tokens_per_s_per_gpu)} tok/s/GPU at ${sig(c.tokens_per_s_per_user)} tok/s/user`);
    const grey = "#4a5561";
    const datasets = [
      { label: "Frontier", data: frontier, showLine: true, borderColor: "#8a949f", borderWidth: 1.5, pointRadius: 0,
        pointHitRadius: 0, backgroundColor: "#8a949f", pointStyle: "line" },
      { label: "meets the SLO", data: frontier.filter((q) => q.meets), pointRadius: 3.5, backgroundColor: grey, borderColor: grey },
      { label: "misses the SLO", data: frontier.filter((q) => !q.meets), pointRadius: 3.5, backgroundColor: "#ffffff",
        borderColor: grey, borderWidth: 1.5 },
    ].filter((ds) => ds.data.length);
    for (const mode of MODES) {
      const data = plan.candidates.filter((c) => c.mode === mode && c !== plan.best).map(cand);
      if (data.length) {
        datasets.push({ label: `${mode} candidates`, data, backgroundColor: MODE_COLOURS[mode] + "cc",
                        borderColor: MODE_COLOURS[mode], pointRadius: 4.5 });
      }
    }
    if (plan.best) {
      datasets.push({ label: "Recommended", data: [cand(plan.best)], pointStyle: "star", pointRadius: 11,
                      borderColor: BEST_COLOUR, backgroundColor: BEST_COLOUR, borderWidth: 2 });
    }
    draw(id, {
      type: "scatter", data: { datasets },
      options: {
        scales: { x: axis("tokens/s per user (1 / mean TPOT)"), y: axis("output tokens/s per GPU", "linear", { min: 0 }) },
        plugins: { tooltip: { callbacks: { label: pointLabel } } },
      },
    }, "Frontier over every configuration and load searched; up and to the right is better.");
  }

  async function sweep(planBody, mode, values, signal) {
    const body = { target: "plan", vary: "rate", values, plan: { ...planBody, modes: [mode] } };
    try {
      return await queue(() => api("/v1/sweep", body, signal));
    } catch (err) {
      if (err instanceof ApiError && err.status === 504 && values.length > 1) {  // past the deadline: halve it
        const half = Math.ceil(values.length / 2);
        const [a, b] = await Promise.all([sweep(planBody, mode, values.slice(0, half), signal),
                                          sweep(planBody, mode, values.slice(half), signal)]);
        return { values: a.values.concat(b.values), labels: a.labels.concat(b.labels),
                 series: { num_gpus: a.series.num_gpus.concat(b.series.num_gpus) } };
      }
      throw err;
    }
  }

  async function loadScaling(body, plan, run, signal) {
    const id = "fig-scaling";
    figureState(id, "loading", "Planning each mode at five rates (/v1/sweep)…");
    const rate = body.workload.rate;
    const values = [...new Set(SCALING_FACTORS.map((f) => round3(f * rate)))].filter((v) => v >= 1e-6 && v <= 1e6);
    const modes = plan.modes.filter((m) => MODES.includes(m));
    const results = await Promise.allSettled(modes.map((m) => sweep(body, m, values, signal)));
    if (run !== planRun) return;
    const failed = results.find((r) => r.status === "rejected");
    if (failed && failed.reason?.name === "AbortError") return;
    const datasets = [];
    modes.forEach((mode, k) => {
      const r = results[k];
      if (r.status !== "fulfilled") return;
      datasets.push({
        label: mode, showLine: true, spanGaps: false, borderColor: MODE_COLOURS[mode], backgroundColor: MODE_COLOURS[mode],
        pointRadius: 4, borderWidth: 2,
        data: r.value.values.map((x, i) => ({ x, y: r.value.series.num_gpus[i], label: r.value.labels[i] || "no deployment meets the SLO",
                                               text: r.value.series.num_gpus[i] == null ? "" : `${r.value.series.num_gpus[i]} GPUs at ${sig(x)} req/s` })),
      });
    });
    if (plan.best) {
      datasets.push({ label: "Recommended", data: [{ x: rate, y: plan.best.num_gpus, label: describe(plan.best.deployment),
                      text: `${plan.best.num_gpus} GPUs at ${sig(rate)} req/s` }],
                      pointStyle: "star", pointRadius: 11, borderColor: BEST_COLOUR, backgroundColor: BEST_COLOUR, borderWidth: 2 });
    }
    if (!datasets.some((ds) => ds.data.some((p) => p.y != null))) {
      figureState(id, failed ? "error" : "empty", failed ? `The sweep failed: ${failed.reason.message}` : "No mode meets the SLO at any of these rates.");
      return;
    }
    const missing = modes.filter((m, k) => results[k].status === "rejected");
    draw(id, {
      type: "scatter", data: { datasets },
      options: {
        scales: { x: axis("request rate (req/s)", "logarithmic"), y: axis("GPUs", "logarithmic") },
        plugins: { tooltip: { callbacks: { label: pointLabel } },
                   markers: { lines: [{ axis: "x", value: rate, label: `planned ${sig(rate)} req/s`, colour: "#6b7480" }] } },
      },
    }, `Best deployment of each mode at ${values.map((v) => sig(v)).join(", ")} req/s; a gap: none meets the SLO there.`
      + (missing.length ? ` Sweep failed for ${missing.join(", ")}: ${results[modes.indexOf(missing[0])].reason.message}.` : ""));
  }

  async function loadCurves(candidate, index) {
    if (!current) return;
    loadAbort?.abort();
    const ctl = new AbortController();
    loadAbort = ctl;
    const { body, plan } = current;
    for (const row of $$("#candidates tbody tr")) row.classList.toggle("selected", row.dataset.index === String(index));
    for (const span of $$(".which-deployment")) span.textContent = describe(candidate.deployment);
    for (const fid of ["fig-ttft", "fig-tpot"]) figureState(fid, "loading", "Evaluating the deployment at 14 rates (/v1/evaluate)…");
    const cap = candidate.capacity_rps;
    const rates = [...new Set([...LOAD_FRACTIONS.map((f) => round3(f * cap)), body.workload.rate])].filter((r) => r >= 1e-6).sort((a, b) => a - b);
    const evaluate = (rate) => queue(() => api("/v1/evaluate", {
      model: body.model, deployment: candidate.deployment, workload: { ...body.workload, rate }, engine: body.engine,
    }, ctl.signal));
    const results = await Promise.allSettled(rates.map(evaluate));
    if (ctl !== loadAbort) return;
    const failed = results.find((r) => r.status === "rejected");
    if (failed?.reason?.name === "AbortError") return;
    const ok = results.filter((r) => r.status === "fulfilled").map((r) => r.value);
    if (!ok.length) {
      for (const fid of ["fig-ttft", "fig-tpot"]) figureState(fid, "error", `The evaluation failed: ${failed.reason.message}`);
      return;
    }
    const keys = Object.keys(ok.find((e) => e.stable)?.ttft_by_percentile_s || { 50: 0, 90: 0 }).map(Number);
    const want = plan.slo.percentile;
    const key = keys.reduce((a, b) => (Math.abs(b - want) < Math.abs(a - want) ? b : a), keys[0]);
    const unstable = rates.filter((r, i) => results[i].status === "fulfilled" && !results[i].value.stable);
    const firstUnstable = results.find((r) => r.status === "fulfilled" && !r.value.stable)?.value;
    const note = (unstable.length ? `Overloaded from ${sig(unstable[0])} req/s (${firstUnstable.binding}): no finite latency there. ` : "")
      + (key !== want ? `The API tabulates p50/p90/p95/p99; p${key} is the nearest to the SLO's p${sig(want)}.` : "");
    const series = (metric, p, scale) => rates.map((x, i) => {
      const r = results[i];
      const v = r.status === "fulfilled" && r.value.stable ? r.value[metric][String(p)] : null;
      return { x, y: v == null ? null : v * scale, text: v == null ? `unstable at ${sig(x)} req/s` : `p${p} ${sig(v * scale)} at ${sig(x)} req/s` };
    });
    const lines = (metric, scale, colour) => [
      { label: `p${key}`, data: series(metric, key, scale), showLine: true, borderColor: colour, backgroundColor: colour, pointRadius: 3, borderWidth: 2 },
      { label: "p50", data: series(metric, 50, scale), showLine: true, borderColor: colour + "80", backgroundColor: colour + "80", pointRadius: 2, borderWidth: 1.5, borderDash: [2, 2] },
    ].filter((ds, i) => i === 0 || key !== 50);
    const rateLine = { axis: "x", value: body.workload.rate, label: `planned ${sig(body.workload.rate)} req/s`, colour: "#6b7480" };
    const ttftMax = 1.3 * Math.max(plan.slo.ttft_s, ...series("ttft_by_percentile_s", key, 1).map((p) => p.y || 0));
    const ttftMin = Math.min(...series("ttft_by_percentile_s", 50, 1).map((p) => p.y || Infinity));
    draw("fig-ttft", {
      type: "scatter", data: { datasets: lines("ttft_by_percentile_s", 1, "#c2410c") },
      options: {
        scales: { x: axis("request rate (req/s)", "linear", { min: 0 }),
                  y: axis("TTFT (s)", "logarithmic", { min: Number.isFinite(ttftMin) ? 10 ** Math.floor(Math.log10(ttftMin)) : undefined, max: ttftMax }) },
        plugins: { tooltip: { callbacks: { label: pointLabel } },
                   markers: { lines: [rateLine, { axis: "y", value: plan.slo.ttft_s, label: `SLO ${sig(plan.slo.ttft_s)} s`, colour: "#b3261e" }] } },
      },
    }, note);
    const tpotMax = Math.max(plan.slo.tpot_s * 1e3 * 1.2, ...series("tpot_by_percentile_s", key, 1e3).map((p) => p.y || 0));
    draw("fig-tpot", {
      type: "scatter", data: { datasets: lines("tpot_by_percentile_s", 1e3, "#1d4ed8") },
      options: {
        scales: { x: axis("request rate (req/s)", "linear", { min: 0 }), y: axis("TPOT (ms)", "linear", { min: 0, suggestedMax: tpotMax }) },
        plugins: { tooltip: { callbacks: { label: pointLabel } },
                   markers: { lines: [rateLine, { axis: "y", value: plan.slo.tpot_s * 1e3, label: `SLO ${ms(plan.slo.tpot_s)} ms`, colour: "#b3261e" }] } },
      },
    }, note);
  }

  // ------------------------------------------------------------------ start

  function renderFields() {
    for (const [key, path, label, unit, group] of NUMBER_FIELDS) {
      $(`[data-fields="${group}"]`).append(el("div", { class: "field", "data-path": path },
        el("label", { for: key }, `${label} `, el("span", { class: "unit", text: unit })),
        el("input", { id: key, name: key, type: "number", step: "any", inputmode: "decimal" })));
    }
  }

  function init() {
    renderFields();
    if (window.Chart) {
      Chart.defaults.font.family = getComputedStyle(document.documentElement).fontFamily;
      Chart.defaults.font.size = 12;
      Chart.defaults.color = "#3a4654";
    }
    $("#plan-form").addEventListener("submit", (e) => { e.preventDefault(); submit(); });
    for (const r of $$("input[name=model-source]")) r.addEventListener("change", showSource);
    $("#model").addEventListener("input", showModelInfo);
    $("#gpus-all").addEventListener("click", () => { for (const i of $$("#gpu-list input")) i.checked = true; });
    $("#gpus-none").addEventListener("click", () => { for (const i of $$("#gpu-list input")) i.checked = false; });
    $("#share").addEventListener("click", async () => {
      const url = `${location.origin}${location.pathname}?${toQuery(readForm())}`;
      try { await navigator.clipboard.writeText(url); $("#run-status").textContent = "Link copied."; } catch {
        $("#run-status").textContent = "The address bar holds the link to this plan.";
      }
      history.replaceState(null, "", url);
    });
    window.addEventListener("popstate", () => {
      const s = fromQuery(new URLSearchParams(location.search));
      writeForm(s);
      if (location.search) runPlan(s, false);
    });
    loadCatalog().then(() => {
      const q = new URLSearchParams(location.search);
      const s = fromQuery(q);
      if (!q.toString()) s.gpus = s.gpus.filter((g) => catalog.gpus.has(g));
      writeForm(s);
      document.body.dataset.catalog = "ready";
      if (q.has("model") || q.has("hf") || q.has("rate")) runPlan(s, false);
    }, (err) => {
      writeForm(fromQuery(new URLSearchParams(location.search)));
      $("#catalog-error").hidden = false;
      $("#catalog-error").textContent = `The model and GPU catalog could not be loaded: ${err.message}`;
      document.body.dataset.catalog = "error";
    });
  }

  init();
})();
