/**
 * @mlx-bun/models: Gemma 4 for MLX on Bun: config.json parsing, weight files and mlx-lm's
 * sanitize, the expected-tensor manifest, the tokenizer (with a streaming detokenizer) and the
 * chat template.
 */
export {
  type Gemma4AssistantConfig,
  type Gemma4Config,
  type Gemma4TextConfig,
  isGemma4AssistantConfig,
  type LayerSpec,
  type LayerType,
  layerSpecs,
  loadGemma4Config,
  parseGemma4AssistantConfig,
  parseGemma4Config,
  parseQuantization,
  readJson,
} from "./config.ts";
export { ConfigError, WeightsError } from "./errors.ts";
export {
  assertTensors,
  checkpointTensorInfo,
  checkTensors,
  expectedTensors,
  findWeights,
  type LoadedWeights,
  loadWeights,
  planSanitize,
} from "./weights.ts";
export { Gemma4Tokenizer, postProcessorBos, readEosTokenIds, StreamingDetokenizer } from "./tokenizer.ts";
export {
  type ChatMessage,
  ChatTemplate,
  type ChatTemplateOptions,
  DEFAULT_RENDER_TIMEOUT_MS,
  MAX_RANGE,
  NoChatTemplateError,
  TemplateTimeoutError,
} from "./chat-template.ts";
export { assertRegularFile } from "./files.ts";
export {
  aspectRatioPreservingSize,
  DEFAULT_IMAGE_PROCESSOR,
  DEFAULT_MAX_PIXELS,
  type DecodeOptions,
  decodeImage,
  ImageError,
  type ImageErrorCode,
  type ImageProcessorConfig,
  loadImageProcessorConfig,
  type PreprocessedImage,
  preprocessImage,
  type RgbImage,
  resizeBicubic,
} from "./vision/preprocess.ts";
export { Gemma4Vision, parseMultimodalTokens, parseVisionConfig, type VisionConfig } from "./vision/tower.ts";
export {
  Gemma4UnifiedVision,
  loadVisionEncoder,
  type ModelPatches,
  modelPatches,
  parseUnifiedVisionConfig,
  takesImages,
  type UnifiedVisionConfig,
} from "./vision/unified.ts";
export type { MultimodalTokens, VisionEncoder } from "./vision/encoder.ts";
export { bidirectionalVision, expandImageTokens, multimodalInputs, type OwnedForwardInputs } from "./vision/embed.ts";
export { type ForwardInputs, Gemma4Model } from "./model/gemma4.ts";
export { type DrafterKv, Gemma4Assistant, isAssistantDir, type LoadedAssistant, loadAssistant } from "./model/assistant.ts";
export { checkKvMode, type KvMode, codecFor, kvModeKey, kvModeName, parseKvMode } from "./model/kv-mode.ts";
export { embed, embedAsLinear, linear, moduleWeights, switchLinear, type ModuleWeights } from "./model/nn.ts";
export { type FusedProjections, fusedProjections, setFusedProjections } from "./model/fused-linear.ts";
export { type LoadedModel, loadModel, loadTextSide } from "./load.ts";
export { type LoadedAdapter, loadAdapter } from "./lora.ts";
export { shardModel, TensorParallel } from "./model/shard.ts";
export {
  GEMMA4_MARKERS,
  type Gemma4Output,
  type Gemma4OutputEvent,
  Gemma4OutputParser,
  type Gemma4OutputParserOptions,
  type Gemma4OutputState,
  parseToolCalls,
  splitGemma4Output,
  type ToolCall,
  ToolCallParseError,
} from "./gemma4-output.ts";
