import type { components } from './gen/api.js';

/** One field-level problem of an error: a validation problem (invalid) or a refusal (refused). */
export type Problem = components['schemas']['Problem'];

/** The daemon's error body (docs/api.md#errors). */
export type ErrorBody = components['schemas']['Error'];

/**
 * The base of every error the SDK throws for an airlock error class. The concrete classes
 * (NotFoundError, RefusedError, …) are generated from the one wire table, so an error is
 * decoded from its code, never from its message.
 */
export class AirlockError extends Error {
  static readonly code: string = '';
  static readonly status: number = 0;
  override readonly name: string = 'AirlockError';
  /** The wire code: "not_found", "refused", … */
  readonly code: string;
  /** The HTTP status, or 0 when the error did not come from an HTTP answer. */
  readonly status: number;
  /** Refines the code, e.g. a token refusal's "expired" or "wrongSession". */
  readonly reason: string;
  /** The daemon's X-Request-Id, to find the request in its log. */
  readonly requestId: string;
  /** Every field problem: validation problems of an invalid declaration, refusals of a refused one. */
  readonly problems: Problem[];

  constructor(message: string, init: { status?: number; reason?: string; requestId?: string; problems?: Problem[]; cause?: unknown } = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    const ctor = new.target as unknown as { code: string; status: number };
    this.code = ctor.code;
    this.status = init.status ?? ctor.status;
    this.reason = init.reason ?? '';
    this.requestId = init.requestId ?? '';
    this.problems = init.problems ?? [];
  }

  /** The problems that name a capability: what the platform cannot enforce. */
  get refusals(): Problem[] {
    return this.problems.filter((p) => p.capability);
  }

  /** The capability of the first refusal ("domainEgressRules"), or "" when none names one. */
  get capability(): string {
    return this.refusals[0]?.capability ?? '';
  }
}
