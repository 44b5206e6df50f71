// Summary statistics of repeated measurements, one definition for every bench (docs/benchmarks.md
// reports min / median / max): the median of an even count is the mean of the two middle values.

/** Min, median and max of `n` measurements. */
export interface Spread {
  min: number;
  median: number;
  max: number;
  n: number;
}

function sortedCopy(xs: readonly number[], what: string): number[] {
  if (!xs.length) throw new Error(`${what} of no measurements`);
  return [...xs].sort((a, b) => a - b);
}

const middle = (s: readonly number[]): number => {
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

/** The median (the mean of the two middle values for an even count). Throws on an empty list. */
export function median(xs: readonly number[]): number {
  return middle(sortedCopy(xs, "median"));
}

/** Min, median and max. Throws on an empty list. */
export function spread(xs: readonly number[]): Spread {
  const s = sortedCopy(xs, "spread");
  return { min: s[0]!, median: middle(s), max: s[s.length - 1]!, n: s.length };
}

/** "min / median / max" with `digits` decimals; "–" for no measurements. */
export function formatSpread(xs: readonly number[], digits = 2): string {
  if (!xs.length) return "–";
  const { min, median: med, max } = spread(xs);
  return `${min.toFixed(digits)} / ${med.toFixed(digits)} / ${max.toFixed(digits)}`;
}
