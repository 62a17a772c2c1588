#define TOY_VALUE 1
