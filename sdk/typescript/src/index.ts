// @airlock-sandbox/sdk: the sandbox declaration builder, its validation (Go spec's verdicts),
// capabilities and plan, and the client of the daemon API.
export * from './errors.js';
export * from './client.js';
export * from './builder.js';
export * from './validate.js';
export * from './plan.js';
export { defaultSocket, Transport } from './transport.js';
export type { Egress, Image, Limits, Sandbox as SandboxDeclaration, Session as SessionDeclaration, Stack as StackDeclaration, Workload } from './gen/declaration.js';
export type { components as APIComponents, paths as APIPaths } from './gen/api.js';
export { readAll } from './transport.js';
