from lanectl.cli import main

main()
