/**
 * Credentials quoted in text, removed before the text is logged: Node sends a URL's userinfo
 * (`http://user:password@host`) as basic auth, so an OTLP endpoint (or any URL) given with one
 * holds a secret, and an SDK that throws on it quotes it in its message.
 */

// From `//` to the last `@` before a blank or a quote: a password holding `@` or `/` goes whole.
const USERINFO = /\/\/[^\s"'<>`]*@/g

/** `text` with the userinfo of every URL in it removed (`http://user:pw@host` becomes `http://host`). */
export const withoutCredentials = (text: string): string => text.replace(USERINFO, "//")

/** Whether `text` quotes a URL with userinfo. */
export const hasCredentials = (text: string): boolean => withoutCredentials(text) !== text
