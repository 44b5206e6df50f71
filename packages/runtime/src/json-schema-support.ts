// The JSON Schema subset that grammar-constrained decoding enforces (structured-output.ts), checked
// before a schema reaches XGrammar: XGrammar silently ignores keywords it does not implement (and
// aborts its WebAssembly module on others), so every keyword is allow-listed here, and a schema
// using anything else is refused with an error naming the keyword and its JSON pointer. The
// checked schema is then rewritten into the form XGrammar enforces exactly (string lengths and
// formats become patterns over characters that need no JSON escape; annotations are dropped), so
// every string the grammar admits validates against the original schema.
import { RequestError } from "./request.ts";

/** A schema the grammar cannot enforce (or that is malformed): names the feature and where it is. */
export class SchemaError extends RequestError {
  override name = "SchemaError";
  constructor(
    message: string,
    /** JSON pointer of the offending schema or keyword ("" = the root). */
    readonly pointer: string,
    /** The keyword or feature refused, e.g. "uniqueItems", "format: ipv6". */
    readonly feature: string,
  ) {
    super(message);
  }
}

/** Keywords that do not constrain instances (dropped before compiling). */
const ANNOTATIONS = new Set(["title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment"]);
/** Allowed only at the root (they name the schema). */
const ROOT_ANNOTATIONS = new Set(["$schema", "$id"]);
const DEFS = ["$defs", "definitions"] as const;
const TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"] as const;
type JsonType = (typeof TYPES)[number];

const STRING_KEYS = ["minLength", "maxLength", "pattern", "format"];
const NUMBER_KEYS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
const ARRAY_KEYS = ["items", "prefixItems", "minItems", "maxItems", "unevaluatedItems"];
const OBJECT_KEYS = ["properties", "required", "additionalProperties", "unevaluatedProperties"];
/** At most one of these per schema object: XGrammar uses the first it finds and ignores the rest. */
const COMBINATORS = ["$ref", "const", "enum", "anyOf", "oneOf", "allOf"] as const;

/** Known JSON Schema keywords the grammar does not enforce, with why. */
const REFUSED: Record<string, string> = {
  not: "negation cannot be expressed by the grammar",
  if: "conditional schemas are not enforced",
  then: "conditional schemas are not enforced",
  else: "conditional schemas are not enforced",
  dependentRequired: "dependent requirements are not enforced",
  dependentSchemas: "dependent schemas are not enforced",
  dependencies: "dependencies are not enforced",
  patternProperties: "patternProperties is not enforced together with properties/required",
  propertyNames: "propertyNames is not enforced together with properties/required",
  minProperties: "minProperties is not enforced",
  maxProperties: "maxProperties is not enforced",
  uniqueItems: "uniqueItems cannot be expressed by the grammar",
  contains: "contains is not enforced",
  minContains: "minContains is not enforced",
  maxContains: "maxContains is not enforced",
  multipleOf: "multipleOf is not enforced",
  $anchor: "anchors are not supported ($ref must be a local JSON pointer)",
  $dynamicRef: "dynamic references are not supported",
  $dynamicAnchor: "dynamic references are not supported",
  $recursiveRef: "recursive references are not supported (use a local $ref)",
  $recursiveAnchor: "recursive references are not supported (use a local $ref)",
  $vocabulary: "vocabularies are not supported",
  contentEncoding: "content encodings are not enforced",
  contentMediaType: "content media types are not enforced",
  contentSchema: "content schemas are not enforced",
  discriminator: "OpenAPI's discriminator is not enforced (oneOf branches are checked for overlap instead)",
  nullable: 'OpenAPI\'s nullable is not JSON Schema: use "type": ["...", "null"]',
};

/**
 * String formats, as patterns whose strings all pass ajv-formats' full validators (a subset where
 * the format is larger: no leap seconds, hostnames of at most three labels). Their characters
 * never need a JSON escape.
 */
const LEAP_YEAR = "([0-9][0-9](0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)";
const DATE =
  "([0-9]{4}-(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|[0-9]{4}-(0[469]|11)-(0[1-9]|[12][0-9]|30)|[0-9]{4}-02-(0[1-9]|1[0-9]|2[0-8])|" + LEAP_YEAR + "-02-29)";
const TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
const LABEL = "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?";
const ATEXT = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]";
export const FORMAT_PATTERNS: Record<string, string> = {
  date: DATE,
  time: TIME,
  "date-time": `${DATE}T${TIME}`,
  uuid: "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
  ipv4: "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
  email: `${ATEXT}+(\\.${ATEXT}+)*@(${LABEL}\\.)+${LABEL}`,
  hostname: `${LABEL}(\\.${LABEL}){0,2}`,
};

/** Characters a pattern-constrained string may hold: none that JSON must escape. */
const FORBIDDEN = (c: number) => c < 0x20 || c === 0x22 || c === 0x5c;
/** Any character but those (XGrammar's regex syntax). */
const SAFE_ANY = '[^"\\\\\\x00-\\x1f]';

const MAX_DEPTH = 64;

export interface PreparedSchema {
  /** The schema XGrammar compiles (annotations dropped, strings rewritten to patterns). */
  schema: unknown;
  /** Its JSON text (what is compiled; the cache key of the compiled grammar). */
  text: string;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

const esc = (k: string) => k.replaceAll("~", "~0").replaceAll("/", "~1");
const where = (p: string) => (p === "" ? "the root" : p);

/**
 * Check `schema` against the supported subset and rewrite it for the grammar compiler. Throws a
 * SchemaError naming the first unsupported or malformed feature and its JSON pointer.
 */
export function prepareJsonSchema(schema: unknown): PreparedSchema {
  const c = new Checker(schema);
  const out = c.visit(schema, "", 0);
  c.checkRefs();
  // Not canonicalJson: XGrammar generates properties in their schema order.
  return { schema: out, text: JSON.stringify(out) };
}

/** JSON with object keys sorted: equal schemas give equal text. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  if (isObject(v)) {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(v[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(v);
}

class Checker {
  /** Pointers of every schema visited ($ref targets must be among them). */
  readonly schemas = new Set<string>();
  readonly refs: { ref: string; at: string }[] = [];

  constructor(readonly root: unknown) {}

  fail(at: string, feature: string, why: string): never {
    throw new SchemaError(`response_format schema: ${why} (at ${where(at)})`, at, feature);
  }

  visit(s: unknown, at: string, depth: number): unknown {
    if (depth > MAX_DEPTH) this.fail(at, "depth", `schemas nested deeper than ${MAX_DEPTH} levels are not supported`);
    this.schemas.add(at);
    if (s === true) return true;
    if (s === false) this.fail(at, "false", "the schema false accepts nothing");
    if (!isObject(s)) this.fail(at, "schema", `a schema must be an object or a boolean, got ${JSON.stringify(s)}`);

    const out: Record<string, unknown> = {};
    // Definitions first: they are schemas wherever they are referenced from.
    for (const d of DEFS) {
      if (s[d] === undefined) continue;
      if (!isObject(s[d])) this.fail(`${at}/${d}`, d, `${d} must be an object of schemas`);
      const defs: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(s[d] as Record<string, unknown>)) defs[k] = this.visit(v, `${at}/${d}/${esc(k)}`, depth + 1);
      out[d] = defs;
    }
    const keys = Object.keys(s).filter((k) => !ANNOTATIONS.has(k) && !(DEFS as readonly string[]).includes(k));
    for (const k of keys) {
      if (ROOT_ANNOTATIONS.has(k)) {
        if (at !== "") this.fail(`${at}/${k}`, k, `${k} is only supported at the root`);
        if (typeof s[k] !== "string") this.fail(`${at}/${k}`, k, `${k} must be a string`);
        continue;
      }
      if (REFUSED[k] !== undefined) this.fail(`${at}/${esc(k)}`, k, `keyword "${k}" is not supported: ${REFUSED[k]}`);
      const known =
        k === "type" ||
        (COMBINATORS as readonly string[]).includes(k) ||
        STRING_KEYS.includes(k) ||
        NUMBER_KEYS.includes(k) ||
        ARRAY_KEYS.includes(k) ||
        OBJECT_KEYS.includes(k);
      if (!known) this.fail(`${at}/${esc(k)}`, k, `keyword "${k}" is not supported (unknown keywords would be ignored)`);
    }
    const has = (k: string) => s[k] !== undefined;

    // type
    let types: JsonType[] | null = null;
    if (has("type")) {
      const t = s.type;
      const list = Array.isArray(t) ? t : [t];
      if (!list.length) this.fail(`${at}/type`, "type", "type must not be an empty list");
      for (const x of list)
        if (typeof x !== "string" || !(TYPES as readonly string[]).includes(x)) this.fail(`${at}/type`, "type", `unknown type ${JSON.stringify(x)}`);
      if (new Set(list).size !== list.length) this.fail(`${at}/type`, "type", "type lists a type twice");
      types = list as JsonType[];
      out.type = Array.isArray(t) ? [...list] : t;
    }

    // Combinators: exactly one, with no sibling validation keyword (XGrammar ignores the siblings).
    const combos = COMBINATORS.filter(has);
    if (combos.length > 1)
      this.fail(
        `${at}/${esc(combos[1]!)}`,
        combos[1]!,
        `"${combos[0]}" together with "${combos[1]}" in one schema is not supported (only the first would be enforced)`,
      );
    const combo = combos[0];
    if (combo !== undefined) {
      const siblings = keys.filter((k) => k !== combo && !ROOT_ANNOTATIONS.has(k) && !(combo === "const" || combo === "enum" ? k === "type" : false));
      if (siblings.length)
        this.fail(
          `${at}/${esc(siblings[0]!)}`,
          siblings[0]!,
          `"${siblings[0]}" next to "${combo}" is not supported (it would be ignored): move it into the ${combo === "$ref" ? "referenced schema" : combo === "anyOf" || combo === "oneOf" || combo === "allOf" ? "branches" : "values"}`,
        );
      switch (combo) {
        case "$ref": {
          const r = s.$ref;
          if (typeof r !== "string" || !/^#(\/(\$defs|definitions)\/[A-Za-z0-9_.-]+)?$/.test(r)) {
            this.fail(
              `${at}/$ref`,
              "$ref",
              `$ref must be "#" or point to a top-level definition such as "#/$defs/Name" (letters, digits, _ . - in the name), got ${JSON.stringify(r)}`,
            );
          }
          this.refs.push({ ref: r, at: `${at}/$ref` });
          out.$ref = r;
          return out;
        }
        case "const":
        case "enum": {
          const values = combo === "const" ? [s.const] : s.enum;
          if (combo === "enum" && (!Array.isArray(values) || values.length === 0)) this.fail(`${at}/enum`, "enum", "enum must be a non-empty list");
          if (types) {
            (values as unknown[]).forEach((v, i) => {
              if (!types!.some((t) => jsonTypeMatches(t, v)))
                this.fail(combo === "enum" ? `${at}/enum/${i}` : `${at}/const`, combo, `${JSON.stringify(v)} is not of type ${types!.join(" or ")}`);
            });
          }
          // The type is implied by the values themselves.
          delete out.type;
          if (combo === "const") out.const = s.const;
          else out.enum = [...(values as unknown[])];
          return out;
        }
        case "anyOf":
        case "oneOf":
        case "allOf": {
          const list = s[combo];
          if (!Array.isArray(list) || list.length === 0) this.fail(`${at}/${combo}`, combo, `${combo} must be a non-empty list of schemas`);
          if (combo === "allOf" && list.length !== 1)
            this.fail(`${at}/allOf`, "allOf", "allOf with more than one schema is not enforced (merge them into one schema)");
          const branches = list.map((b, i) => this.visit(b, `${at}/${combo}/${i}`, depth + 1));
          if (combo === "oneOf") this.checkDisjoint(list, at);
          // oneOf with provably disjoint branches is anyOf.
          if (combo === "allOf") {
            delete out.type;
            return branches[0] === true ? out : { ...out, ...(branches[0] as Record<string, unknown>) };
          }
          out.anyOf = branches;
          delete out.type;
          return out;
        }
      }
    }

    // Several types: one branch per type, each with the keywords of its own type.
    if (types && types.length > 1) {
      const rest = Object.fromEntries(keys.filter((k) => k !== "type" && !ROOT_ANNOTATIONS.has(k)).map((k) => [k, s[k]]));
      delete out.type;
      out.anyOf = types.map((t) => this.visit({ ...rest, type: t }, at, depth + 1));
      return out;
    }
    // The instance kind: the type, else what XGrammar infers from the keywords.
    const kinds: JsonType[] =
      types ??
      (keys.some((k) => ["properties", "additionalProperties", "unevaluatedProperties"].includes(k))
        ? ["object"]
        : keys.some((k) => ["items", "prefixItems", "unevaluatedItems"].includes(k))
          ? ["array"]
          : []);
    if (!kinds.length) {
      const stray = keys.find((k) => STRING_KEYS.includes(k) || NUMBER_KEYS.includes(k) || ARRAY_KEYS.includes(k) || OBJECT_KEYS.includes(k));
      if (stray) this.fail(`${at}/${stray}`, stray, `"${stray}" needs a "type" in the same schema (without one it would be ignored)`);
      return out; // any JSON value
    }
    if (kinds.includes("string")) this.string(s, at, out);
    if (kinds.includes("integer") || kinds.includes("number")) this.numeric(s, at, out, kinds.includes("number") ? "number" : "integer");
    if (kinds.includes("array")) this.array(s, at, out, depth);
    if (kinds.includes("object")) this.object(s, at, out, depth);
    // Keywords of types the instance cannot have constrain nothing; their subschemas are still checked.
    if (!kinds.includes("array"))
      for (const k of ["items", "prefixItems", "unevaluatedItems"]) if (has(k)) this.subschemas(s[k], `${at}/${k}`, depth, k === "prefixItems");
    if (!kinds.includes("object")) {
      for (const k of ["additionalProperties", "unevaluatedProperties"]) if (has(k) && typeof s[k] !== "boolean") this.visit(s[k], `${at}/${k}`, depth + 1);
      if (isObject(s.properties)) for (const [k, v] of Object.entries(s.properties)) this.visit(v, `${at}/properties/${esc(k)}`, depth + 1);
    }
    return out;
  }

  subschemas(v: unknown, at: string, depth: number, list: boolean): void {
    if (list) {
      if (!Array.isArray(v)) this.fail(at, "prefixItems", "prefixItems must be a list of schemas");
      v.forEach((x, i) => this.visit(x, `${at}/${i}`, depth + 1));
    } else this.visit(v, at, depth + 1);
  }

  string(s: Record<string, unknown>, at: string, out: Record<string, unknown>): void {
    const used = STRING_KEYS.filter((k) => s[k] !== undefined);
    const groups = [used.includes("format"), used.includes("pattern"), used.includes("minLength") || used.includes("maxLength")].filter(Boolean).length;
    if (groups > 1) {
      const k = used.find((x) => x !== "format" && x !== "pattern") ?? "pattern";
      this.fail(`${at}/${k}`, k, `"${used.join('", "')}" together in one string schema are not enforced (use one of format, pattern, or minLength/maxLength)`);
    }
    let pattern: string | undefined;
    if (s.format !== undefined) {
      const f = s.format;
      if (typeof f !== "string") this.fail(`${at}/format`, "format", "format must be a string");
      pattern = FORMAT_PATTERNS[f];
      if (pattern === undefined)
        this.fail(`${at}/format`, `format: ${f}`, `string format "${f}" is not supported (supported: ${Object.keys(FORMAT_PATTERNS).join(", ")})`);
    } else if (s.pattern !== undefined) {
      if (typeof s.pattern !== "string") this.fail(`${at}/pattern`, "pattern", "pattern must be a string");
      pattern = sanitizePattern(s.pattern, (why) => this.fail(`${at}/pattern`, "pattern", `pattern ${JSON.stringify(s.pattern)}: ${why}`));
    } else if (s.minLength !== undefined || s.maxLength !== undefined) {
      const min = s.minLength === undefined ? 0 : this.count(s.minLength, `${at}/minLength`, "minLength");
      const max = s.maxLength === undefined ? undefined : this.count(s.maxLength, `${at}/maxLength`, "maxLength");
      if (max !== undefined && min > max) this.fail(`${at}/minLength`, "minLength", `minLength ${min} is greater than maxLength ${max}`);
      // Counted in characters (code points), as JSON Schema; none of them needs an escape.
      pattern = `${SAFE_ANY}{${min},${max ?? ""}}`;
    }
    if (pattern !== undefined) out.pattern = pattern;
  }

  count(v: unknown, at: string, k: string): number {
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) this.fail(at, k, `${k} must be a non-negative integer, got ${JSON.stringify(v)}`);
    return v;
  }

  numeric(s: Record<string, unknown>, at: string, out: Record<string, unknown>, kind: "integer" | "number"): void {
    const bounds = NUMBER_KEYS.filter((k) => s[k] !== undefined);
    if (!bounds.length) return;
    for (const k of bounds) {
      const v = s[k];
      if (typeof v !== "number" || !Number.isFinite(v)) this.fail(`${at}/${k}`, k, `${k} must be a number, got ${JSON.stringify(v)}`);
      if (Math.abs(v) > Number.MAX_SAFE_INTEGER) this.fail(`${at}/${k}`, k, `${k} beyond ±2^53 is not supported`);
      if (kind === "integer" && !Number.isInteger(v)) this.fail(`${at}/${k}`, k, `${k} of an integer must be a whole number, got ${v}`);
      out[k] = v;
    }
    if (s.minimum !== undefined && s.exclusiveMinimum !== undefined)
      this.fail(`${at}/exclusiveMinimum`, "exclusiveMinimum", "minimum together with exclusiveMinimum is not supported (use one)");
    if (s.maximum !== undefined && s.exclusiveMaximum !== undefined)
      this.fail(`${at}/exclusiveMaximum`, "exclusiveMaximum", "maximum together with exclusiveMaximum is not supported (use one)");
    const lo = (s.minimum ?? s.exclusiveMinimum) as number | undefined;
    const hi = (s.maximum ?? s.exclusiveMaximum) as number | undefined;
    // XGrammar's range regex for non-integers is wrong (its "." is unescaped; 1015.26 passes maximum 1000).
    if (kind === "number") this.fail(`${at}/${bounds[0]}`, bounds[0]!, `${bounds[0]} of a number is not enforced (bounds are supported for "integer")`);
    if (lo !== undefined && hi !== undefined) {
      const empty = kind === "integer" ? (s.exclusiveMinimum !== undefined ? lo + 1 : lo) > (s.exclusiveMaximum !== undefined ? hi - 1 : hi) : lo > hi;
      if (empty) this.fail(`${at}/${bounds[0]}`, bounds[0]!, "the numeric bounds admit no value");
    }
  }

  array(s: Record<string, unknown>, at: string, out: Record<string, unknown>, depth: number): void {
    let prefix = 0;
    if (s.prefixItems !== undefined) {
      if (!Array.isArray(s.prefixItems)) this.fail(`${at}/prefixItems`, "prefixItems", "prefixItems must be a list of schemas");
      out.prefixItems = s.prefixItems.map((x, i) => this.visit(x, `${at}/prefixItems/${i}`, depth + 1));
      prefix = s.prefixItems.length;
    }
    let more = false;
    for (const k of ["items", "unevaluatedItems"]) {
      const v = s[k];
      if (v === undefined) continue;
      if (Array.isArray(v)) this.fail(`${at}/${k}`, k, `${k} as a list (draft 4 tuples) is not supported: use prefixItems`);
      if (k === "unevaluatedItems" && s.items !== undefined) continue; // every item is evaluated by items
      out[k] = v === false ? false : this.visit(v, `${at}/${k}`, depth + 1);
      more = v !== false;
      break;
    }
    const min = s.minItems === undefined ? 0 : this.count(s.minItems, `${at}/minItems`, "minItems");
    const max = s.maxItems === undefined ? undefined : this.count(s.maxItems, `${at}/maxItems`, "maxItems");
    if (max !== undefined && min > max) this.fail(`${at}/minItems`, "minItems", `minItems ${min} is greater than maxItems ${max}`);
    if (max !== undefined && max < prefix) this.fail(`${at}/maxItems`, "maxItems", `maxItems ${max} is less than the ${prefix} prefixItems`);
    if (!more && min > prefix) this.fail(`${at}/minItems`, "minItems", `minItems ${min} needs "items" (without it no item beyond prefixItems is generated)`);
    if (s.minItems !== undefined) out.minItems = min;
    if (max !== undefined) out.maxItems = max;
  }

  object(s: Record<string, unknown>, at: string, out: Record<string, unknown>, depth: number): void {
    const names: string[] = [];
    if (s.properties !== undefined) {
      if (!isObject(s.properties)) this.fail(`${at}/properties`, "properties", "properties must be an object of schemas");
      const props: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(s.properties)) {
        const p = `${at}/properties/${esc(k)}`;
        if ([...k].some((ch) => FORBIDDEN(ch.codePointAt(0)!)))
          this.fail(p, "property name", `property names with quotes, backslashes or control characters are not supported: ${JSON.stringify(k)}`);
        props[k] = this.visit(v, p, depth + 1);
        names.push(k);
      }
      out.properties = props;
    }
    if (s.required !== undefined) {
      const r = s.required;
      if (!Array.isArray(r) || r.some((x) => typeof x !== "string")) this.fail(`${at}/required`, "required", "required must be a list of property names");
      if (new Set(r).size !== r.length) this.fail(`${at}/required`, "required", "required lists a property twice");
      r.forEach((name, i) => {
        if (!names.includes(name))
          this.fail(`${at}/required/${i}`, "required", `required property ${JSON.stringify(name)} is not in "properties" (it would not be generated)`);
      });
      if (r.length) out.required = [...r];
    }
    for (const k of ["additionalProperties", "unevaluatedProperties"]) {
      const v = s[k];
      if (v === undefined) continue;
      if (k === "unevaluatedProperties" && s.additionalProperties !== undefined) {
        // every property is evaluated by properties/additionalProperties: it constrains nothing
        if (typeof v !== "boolean") this.visit(v, `${at}/${k}`, depth + 1);
        continue;
      }
      if (v === false) {
        out[k] = false;
        continue;
      }
      if (names.length) {
        this.fail(`${at}/${k}`, k, `${k} other than false next to "properties" is not supported (an extra key could repeat a declared one)`);
      }
      out[k] = this.visit(v, `${at}/${k}`, depth + 1);
    }
  }

  /** oneOf is enforced as anyOf: only when no instance can match two branches. */
  checkDisjoint(list: unknown[], at: string): void {
    for (let i = 0; i < list.length; i++) {
      for (let j = i + 1; j < list.length; j++) {
        if (!disjoint(this.deref(list[i]), this.deref(list[j]), (s) => this.deref(s))) {
          this.fail(
            `${at}/oneOf`,
            "oneOf",
            `oneOf branches ${i} and ${j} may both match a value (oneOf is only enforced when its branches are disjoint by type or by a required const/enum property): use anyOf`,
          );
        }
      }
    }
  }

  deref(s: unknown): unknown {
    for (let n = 0; n < 32 && isObject(s) && typeof s.$ref === "string"; n++) s = resolvePointer(this.root, s.$ref);
    return s;
  }

  checkRefs(): void {
    for (const { ref, at } of this.refs) {
      const target = ref.slice(1);
      if (resolvePointer(this.root, ref) === undefined) this.fail(at, "$ref", `$ref ${JSON.stringify(ref)} points to nothing`);
      if (!this.schemas.has(target)) this.fail(at, "$ref", `$ref ${JSON.stringify(ref)} must point to a schema (e.g. under $defs), not into ${where(target)}`);
    }
  }
}

function resolvePointer(root: unknown, ref: string): unknown {
  let cur = root;
  for (const part of ref.slice(1).split("/").slice(1)) {
    if (!isObject(cur) || !(part in cur)) return undefined;
    cur = cur[part];
  }
  return cur;
}

export function jsonTypeMatches(t: JsonType, v: unknown): boolean {
  switch (t) {
    case "string":
      return typeof v === "string";
    case "integer":
      return typeof v === "number" && Number.isInteger(v);
    case "number":
      return typeof v === "number";
    case "boolean":
      return typeof v === "boolean";
    case "null":
      return v === null;
    case "array":
      return Array.isArray(v);
    case "object":
      return isObject(v);
  }
}

/** The JSON types a (dereferenced) schema can produce, or null when unknown. */
function typesOf(s: unknown): Set<string> | null {
  if (!isObject(s)) return null;
  const valueType = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v === "number" ? "number" : typeof v);
  if (s.const !== undefined) return new Set([valueType(s.const)]);
  if (Array.isArray(s.enum)) return new Set(s.enum.map(valueType));
  if (s.type !== undefined) {
    const list = (Array.isArray(s.type) ? s.type : [s.type]) as string[];
    return new Set(list.map((t) => (t === "integer" ? "number" : t)));
  }
  if (s.properties !== undefined || s.additionalProperties !== undefined) return new Set(["object"]);
  if (s.items !== undefined || s.prefixItems !== undefined) return new Set(["array"]);
  return null;
}

/** The values a schema admits when it is a const or an enum (canonical JSON), else null. */
function valuesOf(s: unknown): Set<string> | null {
  if (!isObject(s)) return null;
  if (s.const !== undefined) return new Set([canonicalJson(s.const)]);
  if (Array.isArray(s.enum)) return new Set(s.enum.map(canonicalJson));
  return null;
}

function disjoint(a: unknown, b: unknown, deref: (s: unknown) => unknown): boolean {
  const ta = typesOf(a);
  const tb = typesOf(b);
  if (ta && tb && ![...ta].some((t) => tb.has(t))) return true;
  const va = valuesOf(a);
  const vb = valuesOf(b);
  if (va && vb) return ![...va].some((v) => vb.has(v));
  // Objects told apart by a property both require, with disjoint const/enum values.
  if (isObject(a) && isObject(b) && isObject(a.properties) && isObject(b.properties) && Array.isArray(a.required) && Array.isArray(b.required)) {
    for (const k of a.required as string[]) {
      if (!(b.required as string[]).includes(k)) continue;
      const pa = valuesOf(deref((a.properties as Record<string, unknown>)[k]));
      const pb = valuesOf(deref((b.properties as Record<string, unknown>)[k]));
      if (pa && pb && ![...pa].some((v) => pb.has(v))) return true;
    }
  }
  return false;
}

// ---- patterns ------------------------------------------------------------------------------------

/**
 * Rewrite an ECMAScript-style `pattern` into XGrammar's regex syntax over characters that need no
 * JSON escape: `.`, negated classes and \D \W \S exclude the quote, the backslash and control
 * characters; \s is the space; a literal quote, backslash or control character is refused, as are
 * lookarounds, backreferences, word boundaries, lazy quantifiers and anchors anywhere but at the
 * ends. XGrammar matches the whole string, which JSON Schema's unanchored search accepts too.
 */
export function sanitizePattern(src: string, fail: (why: string) => never): string {
  let i = 0;
  const peek = () => src[i];
  const out = (): string => alternation();

  function alternation(): string {
    const parts = [sequence()];
    while (peek() === "|") {
      i++;
      parts.push(sequence());
    }
    return parts.join("|");
  }

  function sequence(): string {
    let s = "";
    while (i < src.length && peek() !== "|" && peek() !== ")") {
      const start = i;
      if (peek() === "^") {
        if (start !== 0) fail("^ is only supported at the start");
        i++;
        continue;
      }
      if (peek() === "$") {
        if (start !== src.length - 1) fail("$ is only supported at the end");
        i++;
        continue;
      }
      s += atom() + quantifier();
    }
    return s;
  }

  function quantifier(): string {
    const c = peek();
    let q = "";
    if (c === "*" || c === "+" || c === "?") {
      q = c;
      i++;
    } else if (c === "{") {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(src.slice(i));
      if (!m) fail(`a literal "{" must be escaped`);
      if (m[3] !== undefined && m[3] !== "" && Number(m[3]) < Number(m[1])) fail(`bad repetition ${m[0]}`);
      if (Number(m[1]) > 1000 || Number(m[3] || 0) > 1000) fail("repetition counts above 1000 are not supported");
      q = m[0];
      i += m[0].length;
    } else return "";
    if (peek() === "?" || peek() === "+") fail("lazy and possessive quantifiers are not supported");
    const n = peek();
    if (n === "*" || n === "+" || n === "?" || n === "{") fail("a quantifier must follow an atom");
    return q;
  }

  function atom(): string {
    const c = src[i]!;
    if (c === "(") {
      i++;
      if (peek() === "?") {
        if (src.startsWith("?:", i)) i += 2;
        else fail("lookarounds and named groups are not supported");
      }
      const inner = alternation();
      if (peek() !== ")") fail("unbalanced parenthesis");
      i++;
      return `(${inner})`;
    }
    if (c === ")") fail("unbalanced parenthesis");
    if (c === "*" || c === "+" || c === "?" || c === "{") fail(`nothing to repeat at "${c}"`);
    if (c === "[") return charClass();
    if (c === ".") {
      i++;
      return SAFE_ANY;
    }
    if (c === "\\") return escape(false).text;
    i++;
    return literal(c.codePointAt(0)!, c);
  }

  function literal(cp: number, raw: string): string {
    if (FORBIDDEN(cp)) fail("a literal quote, backslash or control character cannot be generated inside a JSON string here");
    return /[\\^$.|?*+()[\]{}/-]/.test(raw) ? `\\${raw}` : raw;
  }

  /** An escape at src[i] == "\\": a literal (text + code point) or a class text. */
  function escape(inClass: boolean): { text: string; cp?: number; ranges?: [number, number][] } {
    i++;
    const c = src[i];
    if (c === undefined) fail("trailing backslash");
    i++;
    const digits: [number, number][] = [[0x30, 0x39]];
    const word: [number, number][] = [
      [0x30, 0x39],
      [0x41, 0x5a],
      [0x5f, 0x5f],
      [0x61, 0x7a],
    ];
    switch (c) {
      case "d":
        return { text: "[0-9]", ranges: digits };
      case "w":
        return { text: "[a-zA-Z0-9_]", ranges: word };
      case "s":
        return { text: "[ ]", ranges: [[0x20, 0x20]] };
      case "D":
      case "W":
      case "S": {
        if (inClass) fail(`\\${c} inside [] is not supported`);
        const body = c === "D" ? "0-9" : c === "W" ? "a-zA-Z0-9_" : " ";
        return { text: `[^${body}"\\\\\\x00-\\x1f]` };
      }
      case "b":
      case "B":
        fail("word boundaries are not supported");
        break;
      case "x":
      case "u": {
        const m = c === "x" ? /^[0-9a-fA-F]{2}/.exec(src.slice(i)) : /^[0-9a-fA-F]{4}/.exec(src.slice(i));
        if (!m) fail(`bad \\${c} escape`);
        i += m[0].length;
        const cp = Number.parseInt(m[0], 16);
        if (cp >= 0xd800 && cp <= 0xdfff) fail("surrogate escapes are not supported");
        return { text: literalIn(cp), cp };
      }
      case "n":
      case "r":
      case "t":
      case "f":
      case "v":
      case "0":
        fail("a control character cannot be generated inside a JSON string here");
        break;
      default:
        if (/[0-9]/.test(c)) fail("backreferences are not supported");
        if (/[a-zA-Z]/.test(c)) fail(`unknown escape \\${c}`);
        return { text: literalIn(c.codePointAt(0)!), cp: c.codePointAt(0)! };
    }
    return fail("unreachable");
  }

  function literalIn(cp: number): string {
    if (FORBIDDEN(cp)) fail("a literal quote, backslash or control character cannot be generated inside a JSON string here");
    const ch = String.fromCodePoint(cp);
    return /[\\^$.|?*+()[\]{}/-]/.test(ch) ? `\\${ch}` : ch;
  }

  function charClass(): string {
    i++; // [
    let negated = false;
    if (peek() === "^") {
      negated = true;
      i++;
    }
    const ranges: [number, number][] = [];
    let first = true;
    const item = (): { cp?: number; ranges?: [number, number][] } => {
      if (peek() === "\\") return escape(true);
      const ch = String.fromCodePoint(src.codePointAt(i)!);
      i += ch.length;
      return { cp: ch.codePointAt(0)! };
    };
    while (i < src.length && (peek() !== "]" || (first && false))) {
      first = false;
      const a = item();
      if (a.ranges) {
        ranges.push(...a.ranges);
        continue;
      }
      if (peek() === "-" && src[i + 1] !== "]" && i + 1 < src.length) {
        i++;
        const b = item();
        if (b.cp === undefined) fail("a class range must end in a character");
        if (b.cp < a.cp!) fail("a class range is out of order");
        ranges.push([a.cp!, b.cp]);
      } else ranges.push([a.cp!, a.cp!]);
    }
    if (peek() !== "]") fail("unterminated character class");
    i++;
    if (negated) {
      if (!ranges.length) return SAFE_ANY;
      return `[^${ranges.map(classRange).join("")}"\\\\\\x00-\\x1f]`;
    }
    // Drop the characters that would need an escape; nothing left is an error.
    const kept: [number, number][] = [];
    for (const [lo, hi] of ranges) {
      let a = Math.max(lo, 0x20);
      for (const cut of [0x22, 0x5c]) {
        if (a <= cut && cut <= hi) {
          if (a <= cut - 1) kept.push([a, cut - 1]);
          a = cut + 1;
        }
      }
      if (a <= hi) kept.push([a, hi]);
    }
    if (!kept.length) fail("a character class admits only characters that need a JSON escape");
    return `[${kept.map(classRange).join("")}]`;
  }

  function classRange([lo, hi]: [number, number]): string {
    const one = (cp: number) => {
      const ch = String.fromCodePoint(cp);
      if (cp < 0x20 || cp === 0x7f) return `\\x${cp.toString(16).padStart(2, "0")}`;
      return /[\\\]^[-]/.test(ch) ? `\\${ch}` : ch;
    };
    return lo === hi ? one(lo) : `${one(lo)}-${one(hi)}`;
  }

  const result = out();
  if (i !== src.length) fail(src[i] === ")" ? "unbalanced parenthesis" : `unexpected "${src[i]}"`);
  if (result === "") fail("an empty pattern is not supported (omit it)");
  return result;
}
