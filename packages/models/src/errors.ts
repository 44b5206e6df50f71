// Errors of the model package: each names the file and the field or tensor at fault.

/** A config.json / generation_config.json / tokenizer file that is missing, unreadable or invalid. */
export class ConfigError extends Error {
  override name = "ConfigError";
}

/** Weight files that are missing, inconsistent with their index, or do not match the config. */
export class WeightsError extends Error {
  override name = "WeightsError";
}
