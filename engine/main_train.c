/* main_train.c: mge-train, one training rank (placeholder until the engine lands). */
#include <stdio.h>

int main(void)
{
    fprintf(stderr, "mge-train: engine not built yet\n");
    return 2;
}
