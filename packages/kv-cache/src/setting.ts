// A process-wide choice among a few values: set in code, else read from an environment variable,
// else a default; bad values are errors naming the variable or the setter.

export interface Setting<T extends string> {
  /** The value in effect now. */
  get(): T;
  /** Choose for this process; `undefined` goes back to the environment variable (or the default). */
  set(value: T | undefined): void;
}

export function processSetting<T extends string>(env: string, setter: string, choices: readonly T[], fallback: () => T): Setting<T> {
  let current: T | undefined;
  const isChoice = (v: string | undefined): v is T => v !== undefined && (choices as readonly string[]).includes(v);
  return {
    get() {
      if (current !== undefined) return current;
      const v = process.env[env];
      if (v === undefined || v === "") return fallback();
      if (isChoice(v)) return v;
      throw new Error(`${env}=${v}: expected ${choices.join(" or ")}`);
    },
    set(value) {
      if (value !== undefined && !isChoice(value)) throw new Error(`${setter}: expected ${choices.map((c) => `"${c}"`).join(" or ")}, got ${String(value)}`);
      current = value;
    },
  };
}
