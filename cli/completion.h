/* completion.h: mgectl's shell completion scripts (`mgectl completion bash|zsh`). */
#ifndef MGE_CLI_COMPLETION_H
#define MGE_CLI_COMPLETION_H

#include <stdio.h>

/* Write the completion script for @shell ("bash" or "zsh") to @out; -1 for another shell. */
int mgectl_completion_print(const char *shell, FILE *out);

#endif
