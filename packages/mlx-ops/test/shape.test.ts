import { describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Case, compareAll, input } from "./helpers.ts";

// Tolerance: none. Shape and indexing ops move data; results are exact (dtype, shape, bytes).

describe("shape ops vs Python MLX", () => {
  test("reshape/transpose/squeeze/expand_dims/broadcast/concatenate/stack/split/pad/repeat/tile/flatten", () => {
    using x = input([2, 3, 4], "float32", 1);
    using xb = input([2, 3, 4], "bfloat16", 2);
    using y = input([2, 3, 4], "float32", 3);
    using z = input([2, 5, 4], "float32", 4);
    using o = input([1, 3, 1], "int32", 5, 0, 9);
    using r = input([3], "float32", 6);
    const inputs = { x, xb, y, z, o, r };
    const cases: Record<string, Case> = {
      reshape: ["mx.reshape(x, (4, -1))", () => mx.reshape(x, [4, -1])],
      transpose: ["mx.transpose(x)", () => mx.transpose(x)],
      transpose_ax: ["mx.transpose(xb, (1, 0, 2))", () => mx.transpose(xb, [1, 0, 2])],
      swapaxes: ["mx.swapaxes(x, 0, 2)", () => mx.swapaxes(x, 0, 2)],
      moveaxis: ["mx.moveaxis(x, 0, -1)", () => mx.moveaxis(x, 0, -1)],
      squeeze: ["mx.squeeze(o)", () => mx.squeeze(o)],
      squeeze_ax: ["mx.squeeze(o, axis=-1)", () => mx.squeeze(o, -1)],
      squeeze_axes: ["mx.squeeze(o, axis=(0, 2))", () => mx.squeeze(o, [0, 2])],
      expand: ["mx.expand_dims(x, 1)", () => mx.expand_dims(x, 1)],
      expand_many: ["mx.expand_dims(x, (0, -1))", () => mx.expand_dims(x, [0, -1])],
      broadcast: ["mx.broadcast_to(o, (2, 3, 5))", () => mx.broadcast_to(o, [2, 3, 5])],
      concat: ["mx.concatenate([x, z], axis=1)", () => mx.concatenate([x, z], 1)],
      concat0: ["mx.concatenate([x, y])", () => mx.concatenate([x, y])],
      concat_none: ["mx.concatenate([x, z], axis=None)", () => mx.concatenate([x, z], null)],
      stack: ["mx.stack([x, y])", () => mx.stack([x, y])],
      stack_last: ["mx.stack([x, y], axis=-1)", () => mx.stack([x, y], -1)],
      split_sec: ["mx.split(x, 3, axis=1)", () => mx.split(x, 3, 1)],
      split_idx: ["mx.split(z, [1, 3], axis=1)", () => mx.split(z, [1, 3], 1)],
      split_last: ["mx.split(x, 2, axis=-1)", () => mx.split(x, 2, -1)],
      split_one: ["mx.split(x, [], axis=0)", () => mx.split(x, [], 0)],
      pad_int: ["mx.pad(x, 1)", () => mx.pad(x, 1)],
      pad_pair: ["mx.pad(xb, (1, 2), constant_values=-1.5)", () => mx.pad(xb, [1, 2], { constant_values: -1.5 })],
      pad_axes: [
        "mx.pad(x, [(0, 0), (2, 1), (0, 3)])",
        () =>
          mx.pad(x, [
            [0, 0],
            [2, 1],
            [0, 3],
          ]),
      ],
      pad_edge: [
        "mx.pad(x, [(0, 0), (1, 1), (2, 0)], mode='edge')",
        () =>
          mx.pad(
            x,
            [
              [0, 0],
              [1, 1],
              [2, 0],
            ],
            { mode: "edge" },
          ),
      ],
      pad_int_dtype: ["mx.pad(o, 2, constant_values=7)", () => mx.pad(o, 2, { constant_values: 7 })],
      repeat: ["mx.repeat(x, 2, axis=1)", () => mx.repeat(x, 2, 1)],
      repeat_flat: ["mx.repeat(o, 3)", () => mx.repeat(o, 3)],
      tile: ["mx.tile(r, (2, 2))", () => mx.tile(r, [2, 2])],
      tile_int: ["mx.tile(x, 2)", () => mx.tile(x, 2)],
      roll_flat: ["mx.roll(x, 3)", () => mx.roll(x, 3)],
      roll_axis: ["mx.roll(x, -1, 1)", () => mx.roll(x, -1, 1)],
      flatten: ["mx.flatten(x)", () => mx.flatten(x)],
      flatten_part: ["mx.flatten(x, start_axis=1)", () => mx.flatten(x, 1)],
      unflatten: ["mx.unflatten(x, 2, (2, 2))", () => mx.unflatten(x, 2, [2, 2])],
      contiguous: [
        "mx.contiguous(mx.transpose(x))",
        () => {
          using t = mx.transpose(x);
          return mx.contiguous(t);
        },
      ],
    };
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("slice, slice_update (static and array start), take, take_along_axis, put_along_axis", () => {
    using x = input([4, 6, 5], "float32", 11);
    using xb = input([4, 6, 5], "bfloat16", 12);
    using u = input([2, 3, 5], "float32", 13);
    using ub = input([4, 2, 5], "bfloat16", 14);
    using st = MlxArray.fromNumbers([1, 2], [2], "int32");
    using st1 = MlxArray.fromNumbers([3], [1], "int32");
    using idx = MlxArray.fromNumbers([3, 0, 0, 2], [4], "int32");
    using idx2 = MlxArray.fromNumbers([1, 0, 2, 3, 1, 3], [2, 3], "uint32");
    using along = input([4, 6, 2], "int32", 15, 0, 5);
    using vals = input([4, 6, 2], "float32", 16);
    using flatIdx = MlxArray.fromNumbers([0, 7, 119, 3], [4], "int32");
    const inputs = { x, xb, u, ub, st, st1, idx, idx2, along, vals, flatIdx };
    const cases: Record<string, Case> = {
      slice: ["x[1:3, ::2, 1:]", () => mx.slice(x, [1, 0, 1], [3, 6, 5], [1, 2, 1])],
      slice_neg: ["x[::-1, 4:0:-2]", () => mx.slice(x, [-1, 4, 0], [-5, 0, 5], [-1, -2, 1])],
      slice_nostride: ["xb[0:2, 1:4, :]", () => mx.slice(xb, [0, 1, 0], [2, 4, 5])],
      slice_dyn: ["mx.slice(x, st, (0, 1), (2, 3, 5))", () => mx.slice(x, st, [0, 1], [2, 3, 5])],
      slice_dyn1: ["mx.slice(xb, st1, (1,), (4, 2, 5))", () => mx.slice(xb, st1, [1], [4, 2, 5])],
      slice_update: ["mx.slice_update(x, u, st, (0, 1))", () => mx.slice_update(x, u, st, [0, 1])],
      slice_update_b: ["mx.slice_update(xb, ub, st1, (1,))", () => mx.slice_update(xb, ub, st1, [1])],
      slice_update_static: ["(lambda a: (a.__setitem__((slice(1, 3), slice(2, 5)), u), a)[1])(mx.array(x))", () => mx.slice_update(x, u, [1, 2, 0], [3, 5, 5])],
      slice_update_strided: [
        "(lambda a: (a.__setitem__((slice(None), slice(0, 4, 2)), ub), a)[1])(mx.array(xb))",
        () => mx.slice_update(xb, ub, [0, 0, 0], [4, 4, 5], [1, 2, 1]),
      ],
      take: ["mx.take(x, idx, axis=1)", () => mx.take(x, idx, 1)],
      take_2d: ["mx.take(xb, idx2, axis=0)", () => mx.take(xb, idx2, 0)],
      take_flat: ["mx.take(x, flatIdx)", () => mx.take(x, flatIdx)],
      take_int: ["mx.take(x, 2, axis=2)", () => mx.take(x, 2, 2)],
      take_int_flat: ["mx.take(x, 17)", () => mx.take(x, 17)],
      tal: ["mx.take_along_axis(x, along, axis=-1)", () => mx.take_along_axis(x, along, -1)],
      tal_none: ["mx.take_along_axis(x, flatIdx, axis=None)", () => mx.take_along_axis(x, flatIdx, null)],
      pal: ["mx.put_along_axis(x, along, vals, axis=-1)", () => mx.put_along_axis(x, along, vals, -1)],
      pal_scalar: [
        "mx.put_along_axis(xb, along, mx.array(-float('inf'), dtype=mx.bfloat16), axis=2)",
        () => mx.put_along_axis(xb, along, Number.NEGATIVE_INFINITY, 2),
      ],
    };
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("index() mirrors a[...] of MLX Python", () => {
    using x = input([4, 5, 6], "float32", 21);
    using xi = input([3, 4], "int32", 22, -9, 9);
    using i1 = MlxArray.fromNumbers([2, 0, 3], [3], "int32");
    using i2 = MlxArray.fromNumbers([1, 4, 0], [3], "uint32");
    using i3 = MlxArray.fromNumbers([0, 1, 2, 3], [2, 2], "int32");
    using col = MlxArray.fromNumbers([0, 3], [2, 1], "int32");
    const inputs = { x, xi, i1, i2, i3, col };
    // [python index, our entries]
    const table: [string, mx.IndexEntry[]][] = [
      ["1", [1]],
      ["-1", [-1]],
      ["1:3", ["1:3"]],
      ["::-1", ["::-1"]],
      ["None", [null]],
      ["...", ["..."]],
      ["i1", [i1]],
      ["i3", [i3]],
      [":, -1", [":", -1]],
      [":, -1, :", [":", -1, ":"]],
      ["..., None", ["...", null]],
      ["None, ...", [null, "..."]],
      ["..., 0", ["...", 0]],
      ["..., :2", ["...", ":2"]],
      [":, None, 1:4", [":", null, "1:4"]],
      ["None, 0:1", [null, "0:1"]],
      ["1, 2, 3", [1, 2, 3]],
      ["0, :, 0", [0, ":", 0]],
      [":, i2", [":", i2]],
      ["i1, i2", [i1, i2]],
      ["i1, :, i2[0]", [i1, ":", 1]],
      ["i1, i2, 1:5:2", [i1, i2, "1:5:2"]],
      [":, i1, :", [":", i1, ":"]],
      ["i1, :, i1", [i1, ":", i1]],
      [":, None, i2", [":", null, i2]],
      ["col, i1", [col, i1]],
      ["i3, 2", [i3, 2]],
      ["-2:, ..., ::2", ["-2:", "...", "::2"]],
      ["1:100, -100:3", ["1:100", "-100:3"]],
      ["2, ..., None, 1", [2, "...", null, 1]],
      ["::2, mx.array(1), 1:", ["::2", 1, "1:"]],
      ["i1, ::-1", [i1, "::-1"]],
      ["::-1, i2", ["::-1", i2]],
      ["1:3, i2, -1", ["1:3", i2, -1]],
      ["i1, 4:0:-2", [i1, "4:0:-2"]],
      [":, 10:", [":", "10:"]],
      ["i1, 10:", [i1, "10:"]],
      ["None, i1, None, i2", [null, i1, null, i2]],
      ["i3, None", [i3, null]],
    ];
    const cases: Record<string, Case> = {};
    table.forEach(([py, entries], i) => {
      cases[`x${i}`] = [`x[${py}]`, () => mx.index(x, ...entries)];
    });
    cases.int_arr = [
      "xi[:, mx.array([3, 0])]",
      () => {
        using j = MlxArray.fromNumbers([3, 0], [2], "int32");
        return mx.index(xi, ":", j);
      },
    ];
    cases.sl = ["x[1:, :, ::3]", () => mx.index(x, mx.sl(1), mx.sl(), mx.sl(null, null, 3))];
    expect(compareAll(inputs, cases)).toEqual([]);
  });

  test("errors and JS-side checks", () => {
    using a = MlxArray.fromNumbers([1, 2, 3, 4, 5, 6], [2, 3]);
    using b = MlxArray.fromNumbers([1, 2], [2]);
    expect(() => mx.reshape(a, [4, 2])).toThrow(/reshape\(array\(shape=\[2, 3\], dtype=float32\), \[4, 2\]\)/);
    expect(() => mx.reshape(a, [1.5, 4])).toThrow(/reshape: invalid shape/);
    expect(() => mx.concatenate([a, b], 0)).toThrow(/concatenate\(array\(shape=\[2, 3\].*array\(shape=\[2\]/);
    expect(() => mx.split(a, 4, 1)).toThrow(/split\(array\(shape=\[2, 3\], dtype=float32\), 4, axis=1\)/);
    expect(() => mx.split(a, 0)).toThrow(/number of sections must be positive/);
    expect(() => mx.slice(a, [0], [1, 2])).toThrow(/slice: start \[0\], stop \[1, 2\]/);
    expect(() => mx.index(a, 0, 0, 0)).toThrow(/index\(array\(shape=\[2, 3\], dtype=float32\), \[0, 0, 0\]\): too many indices/);
    expect(() => mx.index(a, 2)).toThrow(/out of bounds/);
    expect(() => mx.index(a, "::0")).toThrow(/slice step cannot be zero/);
    expect(() => mx.index(a, "1:a")).toThrow(/cannot parse/);
    expect(() => mx.index(a, "...", "...")).toThrow(/single ellipsis/);
    expect(() => mx.pad(a, [[1, 1]], { mode: "wrap" as never })).toThrow(/unknown mode/);
    expect(() =>
      mx.pad(a, [
        [1, 1],
        [1, 1],
        [1, 1],
      ]),
    ).toThrow(/one \(low, high\) pair per axis/);
    expect(() => mx.pad(a, 1, { constant_values: b })).toThrow(/constant_values must be a scalar/);
    expect(() => mx.expand_dims(a, 0.5)).toThrow(/expand_dims: axis must be an integer/);
    expect(() => mx.take(a, 1.5)).toThrow(/take: index must be an integer/);
    expect(() => mx.broadcast_to(a, [3, 3])).toThrow(/broadcast_to\(array\(shape=\[2, 3\], dtype=float32\), \[3, 3\]\)/);
  });
});
