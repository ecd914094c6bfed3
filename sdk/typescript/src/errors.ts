import { AirlockError, type ErrorBody } from './error-base.js';
import { errorClasses, type ErrorCode, InternalError, InvalidError, OutcomeUnknownError } from './gen/codes.js';

export { AirlockError, type ErrorBody, type Problem } from './error-base.js';
export * from './gen/codes.js';

const byCode = new Map<string, (typeof errorClasses)[number]>(errorClasses.map((c) => [c.code, c]));

/** The class of a wire code; InternalError for a code the table does not know. */
export function errorClassOf(code: string): (typeof errorClasses)[number] {
  return byCode.get(code) ?? InternalError;
}

/**
 * The code of an answer that has no error body (a proxy's, a 405), as Go's
 * api.CodeForStatus: a bare 500 is outcome_unknown, otherwise the first code of the status.
 */
export function codeForStatus(status: number): ErrorCode {
  switch (status) {
    case 400:
    case 405:
    case 411:
      return InvalidError.code;
    case 500:
      return OutcomeUnknownError.code;
  }
  return errorClasses.find((c) => c.status === status)?.code ?? InternalError.code;
}

/** The error an error body stands for, as an instance of its code's class. */
export function errorFromBody(body: ErrorBody, status = 0): AirlockError {
  const Class = errorClassOf(body.code);
  let message = body.message || body.code;
  if (body.reason && !message.includes(body.reason)) message += ` (${body.reason})`;
  return new Class(message, { status: status || Class.status, reason: body.reason, requestId: body.requestId, problems: body.problems });
}
