/* main_train.c: mge-infer, checkpoint evaluation (placeholder until the engine lands). */
#include <stdio.h>

int main(void)
{
    fprintf(stderr, "mge-infer: engine not built yet\n");
    return 2;
}
