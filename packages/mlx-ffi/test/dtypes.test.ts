import { describe, expect, test } from "vitest";
import { DTYPES, type Dtype, MlxArray, fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits } from "../src/index.ts";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";

const SPECIAL = [0, -0, 1, -1.5, 3.140625, 65504, 1e-8, -2.5e-3, 1e30, Infinity, -Infinity, NaN];

// Values each dtype can hold, including its extremes.
const SAMPLES: Record<Dtype, (number | bigint | boolean)[]> = {
  bool: [true, false, true, true],
  uint8: [0, 1, 127, 255],
  uint16: [0, 1, 40000, 65535],
  uint32: [0, 1, 3_000_000_000, 4294967295],
  uint64: [0n, 1n, 2n ** 63n, 2n ** 64n - 1n],
  int8: [-128, -1, 0, 127],
  int16: [-32768, -1, 0, 32767],
  int32: [-2147483648, -1, 0, 2147483647],
  int64: [-(2n ** 63n), -1n, 0n, 2n ** 63n - 1n],
  float16: SPECIAL,
  float32: SPECIAL,
  float64: [...SPECIAL, 1e300, 5e-324],
  bfloat16: SPECIAL,
  complex64: [1, -2, 0.5, Infinity, NaN, 0, -0, 3],
};

describe("dtype round trip", () => {
  for (const dt of DTYPES) {
    test(`${dt}: host → MLX → host keeps every bit`, () => {
      const values = SAMPLES[dt];
      const n = dt === "complex64" ? values.length / 2 : values.length;
      using a = MlxArray.fromNumbers(values, [n], dt);
      expect(a.dtype).toBe(dt);
      expect(a.shape).toEqual([n]);
      expect(a.itemsize).toBe(dt === "complex64" || dt.endsWith("64") ? 8 : a.itemsize);
      const raw = a.toTypedArray();
      using b = MlxArray.fromTypedArray(raw, [n], dt);
      expect(exactDiff(b, a)).toBeNull();
      expect(new Uint8Array(b.toTypedArray().buffer)).toEqual(new Uint8Array(raw.buffer));
    });
  }

  test("every dtype's bytes equal Python MLX's for the same values", () => {
    // Python builds the same arrays from the same JS-printed literals.
    const inputs: Record<string, MlxArray> = {};
    const cases: Record<string, string> = {};
    const py = (v: number | bigint | boolean): string =>
      typeof v === "boolean"
        ? v
          ? "True"
          : "False"
        : typeof v === "bigint"
          ? v.toString()
          : Number.isNaN(v)
            ? "float('nan')"
            : v === Infinity
              ? "float('inf')"
              : v === -Infinity
                ? "float('-inf')"
                : Object.is(v, -0)
                  ? "-0.0"
                  : String(v);
    for (const dt of DTYPES) {
      const values = SAMPLES[dt];
      if (dt === "complex64") {
        const pairs: string[] = [];
        for (let i = 0; i < values.length; i += 2) pairs.push(`complex(${py(values[i]!)}, ${py(values[i + 1]!)})`);
        cases[dt] = `mx.array(np.array([${pairs.join(", ")}], dtype=np.complex64))`;
      } else if (dt === "bfloat16") {
        cases[dt] = `mx.array(np.array([${values.map(py).join(", ")}], dtype=np.float32)).astype(mx.bfloat16)`;
      } else {
        const npName = dt === "bool" ? "bool_" : dt;
        cases[dt] = `mx.array(np.array([${values.map(py).join(", ")}], dtype=np.${npName}), dtype=mx.${dt === "bool" ? "bool_" : dt})`;
      }
      inputs[`x_${dt}`] = MlxArray.fromNumbers(values, [dt === "complex64" ? values.length / 2 : values.length], dt);
    }
    using ref = oracle({}, cases);
    for (const dt of DTYPES) {
      expect(exactDiff(inputs[`x_${dt}`]!, ref.get(dt)), dt).toBeNull();
      inputs[`x_${dt}`]!.dispose();
    }
  });
});

describe("half-precision conversion", () => {
  test("bfloat16 bit patterns: rounding to nearest even, NaN and Inf", () => {
    expect(toBfloat16Bits(1)).toBe(0x3f80);
    expect(toBfloat16Bits(-2)).toBe(0xc000);
    expect(toBfloat16Bits(Infinity)).toBe(0x7f80);
    expect(toBfloat16Bits(-Infinity)).toBe(0xff80);
    expect(Number.isNaN(fromBfloat16Bits(toBfloat16Bits(NaN)))).toBe(true);
    // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
    expect(toBfloat16Bits(1 + 2 ** -8)).toBe(0x3f80);
    expect(toBfloat16Bits(1 + 3 * 2 ** -8)).toBe(0x3f82);
    expect(fromBfloat16Bits(0x4049)).toBe(3.140625);
  });

  test("float16 bit patterns: subnormals, overflow, NaN and Inf", () => {
    expect(toFloat16Bits(1)).toBe(0x3c00);
    expect(toFloat16Bits(65504)).toBe(0x7bff);
    expect(toFloat16Bits(65520)).toBe(0x7c00); // rounds up to Inf
    expect(toFloat16Bits(2 ** -24)).toBe(0x0001); // smallest subnormal
    expect(toFloat16Bits(-0)).toBe(0x8000);
    expect(toFloat16Bits(Infinity)).toBe(0x7c00);
    expect(Number.isNaN(fromFloat16Bits(toFloat16Bits(NaN)))).toBe(true);
    expect(fromFloat16Bits(0x0001)).toBe(2 ** -24);
    expect(fromFloat16Bits(0xfc00)).toBe(-Infinity);
  });

  test("every float16 and bfloat16 bit pattern survives decode → encode", () => {
    for (let h = 0; h < 0x10000; h++) {
      const f = fromFloat16Bits(h);
      if (!Number.isNaN(f)) expect(toFloat16Bits(f)).toBe(h);
      const b = fromBfloat16Bits(h);
      if (!Number.isNaN(b)) expect(toBfloat16Bits(b)).toBe(h);
    }
  });
});

describe("host views", () => {
  test("tolist, item and describe", () => {
    using a = MlxArray.fromNumbers([1, 2, 3, 4, 5, 6], [2, 3], "int32");
    expect(a.tolist()).toEqual([
      [1, 2, 3],
      [4, 5, 6],
    ]);
    expect(a.describe()).toBe("array(shape=[2, 3], dtype=int32)");
    expect(String(a)).toBe("array(shape=[2, 3], dtype=int32)");
    expect(a.nbytes).toBe(24);
    using s = MlxArray.scalar(2.5, "bfloat16");
    expect(s.shape).toEqual([]);
    expect(s.item()).toBe(2.5);
    using n = MlxArray.scalar(NaN, "float32");
    expect(Number.isNaN(n.item())).toBe(true);
    using e = MlxArray.fromNumbers([], [0, 3]);
    expect(e.size).toBe(0);
    expect(e.toTypedArray().length).toBe(0);
  });

  test("inspect never prints the data of a large array", () => {
    using big = MlxArray.fromTypedArray(new Float32Array(1 << 20), [1024, 1024]);
    expect(Bun.inspect(big)).toBe("array(shape=[1024, 1024], dtype=float32)");
  });
});
