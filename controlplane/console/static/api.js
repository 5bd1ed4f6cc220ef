// The console's client of /api/v1: the bearer token this browser keeps, and api(), which
// sends it and turns an error body {"error": {"code", "message"}} into an ApiError.

const API = "/api/v1";
const TOKEN_KEY = "streampilot.token";

/** The token in use (null: none), kept in localStorage by setToken. */
export const auth = { token: localStorage.getItem(TOKEN_KEY) };

export function storeToken(token) {
  auth.token = token || null;
  if (auth.token) localStorage.setItem(TOKEN_KEY, auth.token);
  else localStorage.removeItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (auth.token) headers.Authorization = `Bearer ${auth.token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(API + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = data?.error ?? {};
    throw new ApiError(
      response.status,
      error.code ?? "http_error",
      error.message ?? `${response.status} ${response.statusText}`,
    );
  }
  return data;
}

/** What a refused action says of the scope: a 403 means the token lacks "operate". */
export const scopeHint = (error) => (error.status === 403 ? " (an operate token is needed)" : "");
