// The sampling settings the server accepts (apps/mlx-bun/src/server/validate.ts), with the same
// rules: what the page would send is checked here first, so an invalid value is never sent and
// never silently replaced by the server's default. No DOM types: unit-tested outside the browser.

export interface NumberField {
  /** Settings key. */
  key: NumericKey;
  /** Request body field. */
  api: string;
  /** Element id in the page. */
  id: string;
  label: string;
  /** Shown under the field. */
  help: string;
  integer: boolean;
  min?: number;
  max?: number;
  step: string;
  group: "sampling" | "length" | "penalties" | "xtc";
}

export type NumericKey =
  | "temperature"
  | "topP"
  | "topK"
  | "minP"
  | "seed"
  | "maxTokens"
  | "repetitionPenalty"
  | "repetitionContextSize"
  | "presencePenalty"
  | "frequencyPenalty"
  | "xtcProbability"
  | "xtcThreshold";

export type Settings = Record<NumericKey, number | null> & {
  /** Stop sequences, one per line. */
  stop: string;
  systemPrompt: string;
};

export const NUMBER_FIELDS: readonly NumberField[] = [
  {
    key: "temperature",
    api: "temperature",
    id: "temperature",
    label: "Temperature",
    help: "0 or more; 0 is greedy.",
    integer: false,
    min: 0,
    step: "0.05",
    group: "sampling",
  },
  { key: "topP", api: "top_p", id: "top-p", label: "Top-p", help: "0 to 1; 1 is off.", integer: false, min: 0, max: 1, step: "0.01", group: "sampling" },
  { key: "topK", api: "top_k", id: "top-k", label: "Top-k", help: "A whole number; 0 is off.", integer: true, min: 0, step: "1", group: "sampling" },
  { key: "minP", api: "min_p", id: "min-p", label: "Min-p", help: "0 to 1; 0 is off.", integer: false, min: 0, max: 1, step: "0.01", group: "sampling" },
  {
    key: "seed",
    api: "seed",
    id: "seed",
    label: "Seed",
    help: "A whole number: the same seed gives the same reply.",
    integer: true,
    step: "1",
    group: "sampling",
  },
  {
    key: "maxTokens",
    api: "max_tokens",
    id: "max-tokens",
    label: "Max tokens",
    help: "A whole number, at least 1.",
    integer: true,
    min: 1,
    step: "1",
    group: "length",
  },
  {
    key: "repetitionPenalty",
    api: "repetition_penalty",
    id: "repetition-penalty",
    label: "Repetition penalty",
    help: "0 or more; 0 and 1 are off.",
    integer: false,
    min: 0,
    step: "0.05",
    group: "penalties",
  },
  {
    key: "presencePenalty",
    api: "presence_penalty",
    id: "presence-penalty",
    label: "Presence penalty",
    help: "Any number; 0 is off.",
    integer: false,
    step: "0.1",
    group: "penalties",
  },
  {
    key: "frequencyPenalty",
    api: "frequency_penalty",
    id: "frequency-penalty",
    label: "Frequency penalty",
    help: "Any number; 0 is off.",
    integer: false,
    step: "0.1",
    group: "penalties",
  },
  {
    key: "repetitionContextSize",
    api: "repetition_context_size",
    id: "penalty-context",
    label: "Penalty context",
    help: "Tokens the penalties look back over (whole number, default 20).",
    integer: true,
    min: 0,
    step: "1",
    group: "penalties",
  },
  {
    key: "xtcProbability",
    api: "xtc_probability",
    id: "xtc-probability",
    label: "XTC probability",
    help: "0 to 1; 0 is off.",
    integer: false,
    min: 0,
    max: 1,
    step: "0.05",
    group: "xtc",
  },
  {
    key: "xtcThreshold",
    api: "xtc_threshold",
    id: "xtc-threshold",
    label: "XTC threshold",
    help: "0 to 0.5 while XTC is on (default 0.1).",
    integer: false,
    min: 0,
    max: 1,
    step: "0.01",
    group: "xtc",
  },
];

export const DEFAULT_SETTINGS: Settings = {
  temperature: null,
  topP: null,
  topK: null,
  minP: null,
  seed: null,
  maxTokens: null,
  repetitionPenalty: null,
  repetitionContextSize: null,
  presencePenalty: null,
  frequencyPenalty: null,
  xtcProbability: null,
  xtcThreshold: null,
  stop: "",
  systemPrompt: "",
};

/** One field's text → its value (null: empty, the server's default) or why it is refused. */
export function parseNumber(f: NumberField, raw: string): { value: number | null; error: string | null } {
  const text = raw.trim();
  if (text === "") return { value: null, error: null };
  const v = Number(text);
  if (!Number.isFinite(v)) return { value: null, error: `${f.label} must be a number.` };
  if (f.integer && !Number.isSafeInteger(v)) return { value: null, error: `${f.label} must be a whole number.` };
  if (f.min !== undefined && v < f.min) return { value: null, error: `${f.label} must be at least ${f.min}.` };
  if (f.max !== undefined && v > f.max) return { value: null, error: `${f.label} must be at most ${f.max}.` };
  return { value: v, error: null };
}

export interface Checked {
  settings: Settings;
  /** Element id → message, in the order of the fields. Empty: the settings can be sent. */
  errors: Map<string, string>;
}

/** The form's texts (by field key) → the settings, and every field the server would refuse. */
export function checkSettings(raw: Partial<Record<NumericKey, string>>, text: { stop: string; systemPrompt: string }): Checked {
  const settings: Settings = { ...DEFAULT_SETTINGS, stop: text.stop, systemPrompt: text.systemPrompt };
  const errors = new Map<string, string>();
  for (const f of NUMBER_FIELDS) {
    const { value, error } = parseNumber(f, raw[f.key] ?? "");
    settings[f.key] = value;
    if (error) errors.set(f.id, error);
  }
  // With XTC on, the server also needs the threshold in [0, 0.5] (its default, 0.1, is).
  if ((settings.xtcProbability ?? 0) > 0 && (settings.xtcThreshold ?? 0.1) > 0.5 && !errors.has("xtc-threshold")) {
    errors.set("xtc-threshold", "XTC threshold must be at most 0.5 while XTC probability is above 0.");
  }
  return { settings, errors };
}

/** Stop sequences: the non-empty lines. */
export function stopList(stop: string): string[] {
  return stop.split(/\r?\n/).filter((s) => s.length > 0);
}

/** Request body fields for the settings (absent = the server's default). */
export function samplingFields(s: Settings): Record<string, number | string[]> {
  const f: Record<string, number | string[]> = {};
  for (const field of NUMBER_FIELDS) {
    const v = s[field.key];
    if (v !== null) f[field.api] = v;
  }
  const stop = stopList(s.stop);
  if (stop.length) f.stop = stop;
  return f;
}
