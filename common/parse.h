/* parse.h: strict parsing of numbers from command lines and environment variables. */
#ifndef MGE_COMMON_PARSE_H
#define MGE_COMMON_PARSE_H

#include <stdbool.h>

/*
 * Parse all of @s as a decimal integer in [@lo, @hi] into *@out. Leading spaces, a sign and
 * nothing else are accepted (no trailing text: "2x" is refused, not 2). Returns false, with
 * *@out unchanged, for an empty string, trailing text, overflow or a value out of range.
 */
bool mge_parse_int(const char *s, long long lo, long long hi, long long *out);

#endif
