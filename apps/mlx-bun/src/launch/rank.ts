// One rank of a launched group (`mlx-bun launch`): join the group, shard the model, then rank 0
// runs the command (generate, serve) over a LeaderModel while the other ranks follow its steps.
import { writeSync } from "node:fs";
import { loadModel, shardModel } from "@mlx-bun/models";
import { type Backend, Engine, type EngineOptions, followSteps, type Group, joinGroup, LeaderModel } from "@mlx-bun/runtime";

/** The backend this process was launched for, or null when it runs alone. */
export function launchedBackend(): Backend | null {
  const b = process.env.MLX_BUN_DIST_BACKEND;
  if (!b) return null;
  if (b !== "ring" && b !== "nccl" && b !== "any" && b !== "mpi" && b !== "jaccl")
    throw new Error(`MLX_BUN_DIST_BACKEND=${b} is not a backend (ring | nccl | any)`);
  return b;
}

/** Tell the launcher this rank is alive (a byte on MLX_BUN_HEARTBEAT_FD); a no-op when not launched. */
export function heartbeat(): void {
  const fd = Number(process.env.MLX_BUN_HEARTBEAT_FD);
  if (!Number.isInteger(fd) || fd < 0) return;
  try {
    writeSync(fd, ".");
  } catch {
    // The launcher is gone; the group is being torn down anyway.
  }
}

/** Rank 0's engine: disposing it first tells the followers to stop. */
class LeaderEngine extends Engine {
  constructor(
    loaded: ConstructorParameters<typeof Engine>[0],
    opts: EngineOptions,
    readonly leader: LeaderModel,
    readonly group: Group,
  ) {
    super(loaded, { ...opts, stepModel: leader });
  }

  override dispose(): void {
    try {
      this.leader.stop();
    } finally {
      super.dispose();
      this.group.dispose();
    }
  }
}

/**
 * Join the launched group and load the model sharded across it. On rank 0 this returns the
 * engine; on the other ranks it follows rank 0's steps until it says stop, then exits the process.
 */
export function loadRankEngine(dir: string, backend: Backend, opts: EngineOptions): Engine {
  const group = joinGroup(backend);
  const loaded = loadModel(dir);
  try {
    const tp = shardModel(loaded, group);
    if (group.rank() === 0) {
      const beat = setInterval(heartbeat, 250);
      beat.unref();
      heartbeat();
      return new LeaderEngine(loaded, opts, new LeaderModel(loaded.model, tp), group);
    }
    heartbeat();
    followSteps(loaded.model, tp, { onStep: heartbeat });
  } catch (e) {
    loaded.dispose();
    group.dispose();
    throw e;
  }
  loaded.dispose();
  group.dispose();
  process.exit(0);
}
