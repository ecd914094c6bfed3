// Code generated from sandbox/sbtypes/codes.go (the one wire table) by sdk/typescript's
// TestCodesTable; DO NOT EDIT. Regenerate: go test ./sdk/typescript -run TestCodesTable -update

import { AirlockError } from '../error-base.js';

/** Code "invalid", HTTP 400: Go's sandbox.ErrInvalid (invalid). */
export class InvalidError extends AirlockError {
  static override readonly code = "invalid";
  static override readonly status = 400;
  override readonly name: string = "InvalidError";
}

/** Code "unauthenticated", HTTP 401: Go's sandbox.ErrUnauthenticated (unauthenticated). */
export class UnauthenticatedError extends AirlockError {
  static override readonly code = "unauthenticated";
  static override readonly status = 401;
  override readonly name: string = "UnauthenticatedError";
}

/** Code "forbidden", HTTP 403: Go's sandbox.ErrForbidden (forbidden). */
export class ForbiddenError extends AirlockError {
  static override readonly code = "forbidden";
  static override readonly status = 403;
  override readonly name: string = "ForbiddenError";
}

/** Code "not_found", HTTP 404: Go's sandbox.ErrNotFound (not found). */
export class NotFoundError extends AirlockError {
  static override readonly code = "not_found";
  static override readonly status = 404;
  override readonly name: string = "NotFoundError";
}

/** Code "conflict", HTTP 409: Go's sandbox.ErrConflict (conflict). */
export class ConflictError extends AirlockError {
  static override readonly code = "conflict";
  static override readonly status = 409;
  override readonly name: string = "ConflictError";
}

/** Code "too_large", HTTP 413: Go's sandbox.ErrTooLarge (too large). */
export class TooLargeError extends AirlockError {
  static override readonly code = "too_large";
  static override readonly status = 413;
  override readonly name: string = "TooLargeError";
}

/** Code "refused", HTTP 422: Go's sandbox.ErrRefused (refused). */
export class RefusedError extends AirlockError {
  static override readonly code = "refused";
  static override readonly status = 422;
  override readonly name: string = "RefusedError";
}

/** Code "unsupported", HTTP 501: Go's sandbox.ErrUnsupported (unsupported). */
export class UnsupportedError extends AirlockError {
  static override readonly code = "unsupported";
  static override readonly status = 501;
  override readonly name: string = "UnsupportedError";
}

/** Code "deadline_exceeded", HTTP 504: Go's sandbox.ErrDeadlineExceeded (deadline exceeded). */
export class DeadlineExceededError extends AirlockError {
  static override readonly code = "deadline_exceeded";
  static override readonly status = 504;
  override readonly name: string = "DeadlineExceededError";
}

/** Code "unreachable", HTTP 502: Go's sandbox.ErrUnreachable (unreachable). */
export class UnreachableError extends AirlockError {
  static override readonly code = "unreachable";
  static override readonly status = 502;
  override readonly name: string = "UnreachableError";
}

/** Code "outcome_unknown", HTTP 504: Go's sandbox.ErrOutcomeUnknown (outcome unknown). */
export class OutcomeUnknownError extends AirlockError {
  static override readonly code = "outcome_unknown";
  static override readonly status = 504;
  override readonly name: string = "OutcomeUnknownError";
}

/** Code "canceled", HTTP 499: the request was cancelled (context.Canceled). */
export class CanceledError extends AirlockError {
  static override readonly code = "canceled";
  static override readonly status = 499;
  override readonly name: string = "CanceledError";
}

/** Code "internal", HTTP 500: an error of no class: a bug. */
export class InternalError extends AirlockError {
  static override readonly code = "internal";
  static override readonly status = 500;
  override readonly name: string = "InternalError";
}

/** Every wire code and its class, in the table's order (the first class of a status wins). */
export const errorClasses = [
  InvalidError,
  UnauthenticatedError,
  ForbiddenError,
  NotFoundError,
  ConflictError,
  TooLargeError,
  RefusedError,
  UnsupportedError,
  DeadlineExceededError,
  UnreachableError,
  OutcomeUnknownError,
  CanceledError,
  InternalError,
] as const;

/** A wire code. */
export type ErrorCode = (typeof errorClasses)[number]['code'];
